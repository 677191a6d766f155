-- park_return.lua: a claimed entry could not be published: put it back at its old
-- place in the queue (the broker refused it), or move it to the dead-letter list
-- (its payload cannot be decoded). Either way its reserved capacity is freed. Or
-- the entry's run leaves this queue for good ("drop": it parked in another queue
-- first, #25 -- a run claimed by a rate limiter and refused a concurrency permit):
-- its id is consumed as a take would (a later message of it is a duplicate), its
-- reservation freed (a rate claim's charge refunded: it is charged when it starts),
-- whether it was claimed or still parked.
--
-- KEYS[1]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[2]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket.
-- KEYS[3]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[4]  taken     zset: consumed ids scored by when they are forgotten (ms);
--                    mode "drop" adds the id.
-- KEYS[5]  dead      list: dead-lettered entries, "<id> <server ms> <reason>\n<payload>",
--                    newest last, at most DEAD_LETTERS kept.
-- KEYS[6]  done      string "<capacity keys' prefix>:done:<id>:back": written when the
--                    entry is returned, kept RELEASE_MEMORY_MS, so a re-sent call (its
--                    reply lost) answers 1 as the first did.
-- KEYS[7]… the capacity's keys (see capacity_of in lib_capacity.lua).
-- ARGV[1]  id        the claimed entry's id.
-- ARGV[2]  mode      "park": back to the queue; "dead": to the dead-letter list;
--                    "drop": consumed and removed (see above).
-- ARGV[3]  reason    mode "dead": why (one line of text); mode "drop": ms the
--                    consumed id is remembered (empty: TAKEN_MEMORY_MS).
-- ARGV[4]  keep      milliseconds the dead-letter list is kept after this write.
-- ARGV[5]… the capacity's arguments (see capacity_of in lib_capacity.lua).
-- Constants (see lib_parking.lua, lib_lock.lua): DEAD_LETTERS, RELEASE_MEMORY_MS,
-- TAKEN_MEMORY_MS.
--
-- Returns {stamp, reply} (stamp: 'pb' and the first 8 characters of ARGV[1]);
-- reply 1 when the entry was claimed and is now returned, 0 when it was not (a
-- run took it meanwhile). Mode "drop": 1 when the entry was claimed or parked and
-- is now consumed, 0 when its id was consumed already (a re-sent drop too).

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua
--!include lib_parking.lua

local k = parking_keys(KEYS)
local id = ARGV[1]
local STAMP = 'pb' .. string.sub(ARGV[1], 1, 8)

if ARGV[2] == 'drop' then
  if redis.call('ZSCORE', k.taken, id) then return {STAMP, 0} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local memory = tonumber(ARGV[3]) or {{TAKEN_MEMORY_MS}}
  redis.call('ZREMRANGEBYSCORE', k.taken, '-inf', string.format('%d', now))
  redis.call('ZADD', k.taken, string.format('%d', now + memory), id)
  if redis.call('PTTL', k.taken) < memory then redis.call('PEXPIRE', k.taken, memory) end
  local note = redis.call('HGET', k.payloads, 'n:' .. id)
  if redis.call('ZREM', k.claimed, id) == 1 then
    local c = capacity_of(KEYS, 7, ARGV, 5)
    capacity_unreserve(c, id, note, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  end
  redis.call('ZREM', k.parked, id)
  redis.call('HDEL', k.payloads, 'p:' .. id, 'o:' .. id, 't:' .. id, 'n:' .. id)
  return {STAMP, 1}
end

if redis.call('ZREM', k.claimed, id) == 0 then return {STAMP, redis.call('EXISTS', KEYS[6])} end
redis.call('SET', KEYS[6], '1', 'PX', {{RELEASE_MEMORY_MS}})
local t = redis.call('TIME')
local note = redis.call('HGET', k.payloads, 'n:' .. id)
redis.call('HDEL', k.payloads, 'n:' .. id)
capacity_unreserve(capacity_of(KEYS, 7, ARGV, 5), id, note,
  tonumber(t[1]) * 1000000 + tonumber(t[2]))
if ARGV[2] == 'park' then
  local ticket = redis.call('HGET', k.payloads, 't:' .. id)
  if ticket then redis.call('ZADD', k.parked, ticket, id) end
  return {STAMP, 1}
end
local payload = redis.call('HGET', k.payloads, 'p:' .. id) or ''
redis.call('HDEL', k.payloads, 'p:' .. id, 'o:' .. id, 't:' .. id)
redis.call('RPUSH', k.dead, id .. ' ' .. t[1] .. string.format('%03d', math.floor(t[2] / 1000))
  .. ' ' .. ARGV[3] .. '\n' .. payload)
redis.call('LTRIM', k.dead, -{{DEAD_LETTERS}}, -1)
redis.call('PEXPIRE', k.dead, ARGV[4])
return {STAMP, 1}
