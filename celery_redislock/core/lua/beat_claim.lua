-- beat_claim.lua: claim one scheduled slot of a beat entry; each slot is claimed at
-- most once, ever (celery_redislock.celery.beat, issue #26).
--
-- Claims of one entry only move forward in time: a slot is granted when it is later
-- than the entry's last claimed slot, so a beat that wakes up late (paused, cut off)
-- can never send a slot that was sent, and the next leader's catch-up, which claims
-- the missed slots oldest first, can never send one twice.
--
-- KEYS[1]  sent    hash: entry name -> "<slot ms> <claim token>", the entry's last
--                  claimed slot.
-- KEYS[2]  by      hash: entry name -> "<server ms> <owner>", when and by whom that
--                  slot was claimed (read by `celery redislock beat`).
-- ARGV[1]  token   the claiming beat's token (one per beat process).
-- ARGV[2]  entry   the schedule entry's name.
-- ARGV[3]  slot    the slot: the run's scheduled time, ms since the Unix epoch.
-- ARGV[4]  owner   the claiming beat's owner id (host:pid:...), for the CLI.
--
-- A re-sent call (its reply lost, redis-py retried it) finds its own token on the
-- slot and answers 1 as the first execution did.
--
-- Returns {1, slot} when the slot is this beat's to send; {0, last} when it is not:
-- `last` is the entry's last claimed slot (ms), which is at or after ARGV[3].
local last = redis.call('HGET', KEYS[1], ARGV[2])
local slot = tonumber(ARGV[3])
if last then
  local space = string.find(last, ' ', 1, true)
  local last_slot = tonumber(string.sub(last, 1, space - 1))
  if last_slot == slot and string.sub(last, space + 1) == ARGV[1] then
    return {1, slot}
  end
  if last_slot >= slot then
    return {0, last_slot}
  end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ' ' .. ARGV[1])
local now = redis.call('TIME')
redis.call('HSET', KEYS[2], ARGV[2], (now[1] * 1000 + math.floor(now[2] / 1000)) .. ' ' .. ARGV[4])
return {1, slot}
