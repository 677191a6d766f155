-- park_take.lua: a published parked run starts: consume its park token (once only)
-- and take the capacity reserved for it, or free capacity.
--
-- KEYS[1]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[2]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket,
--                    "n:<id>" its reservation's note; "r:<id>" the owner of a
--                    refused take.
-- KEYS[3]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[4]  taken     zset: consumed ids scored by when they are forgotten (ms).
-- KEYS[5]  dead      list: dead-lettered entries, unused here.
-- KEYS[6]  done      string "<capacity keys' prefix>:done:<id>:take": the owner of
--                    a granted take where the capacity keeps no lease to say so (a
--                    rate limiter's), kept RELEASE_MEMORY_MS for a re-sent take.
-- KEYS[7]… the capacity's keys (see capacity_of in lib_capacity.lua).
-- ARGV[1]  id        the run's park token (its message header).
-- ARGV[2]  ttl       the run's lease time, milliseconds (integer > 0).
-- ARGV[3]  owner     owner id recorded with the run's capacity.
-- ARGV[4]  memory    ms the consumed id is remembered (empty: TAKEN_MEMORY_MS); the
--                    key lives as long as its longest memory.
-- ARGV[5]… the capacity's arguments (see capacity_of in lib_capacity.lua); a
--                    semaphore's limit is used when the semaphore stores none.
-- Constants (see lib_lock.lua, lib_parking.lua, lib_capacity.lua): FENCE_MEMORY_MS,
-- TAKEN_MEMORY_MS, RELEASE_MEMORY_MS, START_MARGIN_US.
--
-- Returns {stamp, reply} (stamp: 'pt' and the first 8 characters of ARGV[1]);
-- reply {1, fence, ttl}: the capacity is the run's, its lease token is `id` (the
-- reserved one, or free capacity when the reservation lapsed or Redis lost the
-- entry); {0}: the id is consumed but no capacity is free (the caller parks the run
-- again); {-1}: the id was consumed before: this message is a duplicate and must not
-- run. A re-sent take (same id and owner, its reply lost) answers as the first did:
-- {1, fence, ms left} while what it granted lasts, {0} if it was refused (its owner
-- is kept as "r:<id>" in payloads). {2, µs}: the run came before its admission time
-- (a rate limiter's claim charged ahead, capacity_due): nothing is consumed; take
-- again in that many µs.

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua
--!include lib_parking.lua

local STAMP = 'pt' .. string.sub(ARGV[1], 1, 8)
local k = parking_keys(KEYS)
local c = capacity_of(KEYS, 7, ARGV, 5)
local id, ttl, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now, now_us = server_clock()

if redis.call('ZSCORE', k.taken, id) then
  local held = capacity_held(c, id, owner, now, KEYS[6])
  if held then return {STAMP, {1, held[1], held[2]}} end
  if owner ~= '' and redis.call('HGET', k.payloads, 'r:' .. id) == owner then return {STAMP, {0}} end
  return {STAMP, {-1}}
end
local due = capacity_due(c, redis.call('ZSCORE', k.claimed, id),
  redis.call('HGET', k.payloads, 'n:' .. id), now)
if due > now_us then return {STAMP, {2, due - now_us}} end
redis.call('ZREMRANGEBYSCORE', k.taken, '-inf', string.format('%d', now))
local memory = tonumber(ARGV[4]) or {{TAKEN_MEMORY_MS}}
redis.call('ZADD', k.taken, string.format('%d', now + memory), id)
if redis.call('PTTL', k.taken) < memory then redis.call('PEXPIRE', k.taken, memory) end
local claim = redis.call('ZSCORE', k.claimed, id)
local note = redis.call('HGET', k.payloads, 'n:' .. id)
redis.call('ZREM', k.claimed, id)
redis.call('ZREM', k.parked, id)
redis.call('HDEL', k.payloads, 'p:' .. id, 'o:' .. id, 't:' .. id, 'n:' .. id)

local reserved = capacity_take_reserved(c, id, ttl, owner, now, now_us, claim, note)
if reserved then
  capacity_note_taken(c, KEYS[6], owner)
  return {STAMP, {1, reserved[1], reserved[2]}}
end
-- No reservation (it lapsed, or Redis lost it): free capacity, unless runs are
-- parked ahead (then this one parks again, behind them).
capacity_ready(c, now, now_us, false)
if redis.call('ZCARD', k.parked) > 0 or capacity_free(c, now) <= 0 then
  -- Remembered (rare: a reservation lapsed), so a re-sent take is refused again.
  if owner ~= '' then redis.call('HSET', k.payloads, 'r:' .. id, owner) end
  return {STAMP, {0}}
end
local granted = capacity_grant(c, id, owner, ttl, now, now_us)
capacity_note_taken(c, KEYS[6], owner)
return {STAMP, {1, granted[1], granted[2]}}
