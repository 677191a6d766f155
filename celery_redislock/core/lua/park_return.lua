-- park_return.lua: a claimed entry could not be published: put it back at its old
-- place in the queue (the broker refused it), or move it to the dead-letter list
-- (its payload cannot be decoded). Either way its reserved permit is freed.
--
-- KEYS[1]  holders   zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases    hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[4]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket.
-- KEYS[5]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[6]  dead      list: dead-lettered entries, "<id> <server ms> <reason>\n<payload>",
--                    newest last, at most DEAD_LETTERS kept.
-- KEYS[7]  done      string "<prefix>:semaphore:{name}:done:<id>:back": written when the
--                    entry is returned, kept RELEASE_MEMORY_MS, so a re-sent call (its
--                    reply lost) answers 1 as the first did.
-- ARGV[1]  id        the claimed entry's id.
-- ARGV[2]  mode      "park": back to the queue; "dead": to the dead-letter list.
-- ARGV[3]  reason    mode "dead": why (one line of text).
-- ARGV[4]  keep      milliseconds the dead-letter list is kept after this write.
-- Constants (see lib_parking.lua, lib_lock.lua): DEAD_LETTERS, RELEASE_MEMORY_MS.
--
-- Returns {stamp, reply} (stamp: 'pb' and the first 8 characters of ARGV[1]);
-- reply 1 when the entry was claimed and is now returned, 0 when it was not (a
-- run took it meanwhile).

local holders, leases, parked, payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local STAMP = 'pb' .. string.sub(ARGV[1], 1, 8)

if redis.call('ZREM', KEYS[5], id) == 0 then return {STAMP, redis.call('EXISTS', KEYS[7])} end
redis.call('SET', KEYS[7], '1', 'PX', {{RELEASE_MEMORY_MS}})
redis.call('ZREM', holders, id)
redis.call('HDEL', leases, 'f:' .. id, 'o:' .. id, 's:' .. id)
if ARGV[2] == 'park' then
  local ticket = redis.call('HGET', payloads, 't:' .. id)
  if ticket then redis.call('ZADD', parked, ticket, id) end
  return {STAMP, 1}
end
local t = redis.call('TIME')
local payload = redis.call('HGET', payloads, 'p:' .. id) or ''
redis.call('HDEL', payloads, 'p:' .. id, 'o:' .. id, 't:' .. id)
redis.call('RPUSH', KEYS[6], id .. ' ' .. t[1] .. string.format('%03d', math.floor(t[2] / 1000))
  .. ' ' .. ARGV[3] .. '\n' .. payload)
redis.call('LTRIM', KEYS[6], -{{DEAD_LETTERS}}, -1)
redis.call('PEXPIRE', KEYS[6], ARGV[4])
return {STAMP, 1}
