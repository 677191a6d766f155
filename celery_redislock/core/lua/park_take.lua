-- park_take.lua: a published parked run starts: consume its park token (once only)
-- and take the permit reserved for it, or a free one.
--
-- KEYS[1]  holders   zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases    hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  fence     string: last fence granted.
-- KEYS[4]  meta      hash: "limit", the limit the latest acquire enforced.
-- KEYS[5]  queue     zset: runs waiting in place (semaphore waiters), read only.
-- KEYS[6]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[7]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket;
--                    "r:<id>" the owner of a refused take.
-- KEYS[8]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[9]  taken     zset: consumed ids scored by when they are forgotten (ms).
-- ARGV[1]  id        the run's park token (its message header).
-- ARGV[2]  ttl       the run's lease time, milliseconds (integer > 0).
-- ARGV[3]  owner     owner id recorded with the run's permit.
-- ARGV[4]  limit     the caller's limit (integer >= 1), used when meta holds none.
-- ARGV[5]  grace     optional: the restart grace, ms (see restart_grace in
--                    lib_restart.lua): within it, permits not taken back yet by their
--                    holders from before a data loss are held for them. Empty: none.
-- ARGV[6]  memory    optional: ms the consumed id is remembered (default
--                    TAKEN_MEMORY_MS); the key lives as long as its longest memory.
-- Constants (see lib_lock.lua, lib_parking.lua): FENCE_MEMORY_MS, TAKEN_MEMORY_MS.
--
-- Returns {stamp, reply} (stamp: 'pt' and the first 8 characters of ARGV[1]);
-- reply {1, fence, ttl}: the permit is the run's, its lease token is `id` (the
-- reserved one, or a free one when the reservation lapsed or Redis lost the entry);
-- {0}: the id is consumed but no permit is free (the caller parks the run again);
-- {-1}: the id was consumed before: this message is a duplicate and must not run.
-- A re-sent take (same id and owner, its reply lost) answers as the first did:
-- {1, fence, ms left} while the lease it granted is live, {0} if it was refused
-- (its owner is kept as "r:<id>" in payloads).

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua

local STAMP = 'pt' .. string.sub(ARGV[1], 1, 8)
local k = parking_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8])
local taken, id, ttl, owner = KEYS[9], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now, now_us = server_clock()

if redis.call('ZSCORE', taken, id) then
  local expiry = redis.call('ZSCORE', k.holders, id)
  if expiry and tonumber(expiry) > now and owner ~= ''
      and redis.call('HGET', k.leases, 'o:' .. id) == owner then
    return {STAMP, {1, tonumber(redis.call('HGET', k.leases, 'f:' .. id)), tonumber(expiry) - now}}
  end
  if owner ~= '' and redis.call('HGET', k.payloads, 'r:' .. id) == owner then return {STAMP, {0}} end
  return {STAMP, {-1}}
end
redis.call('ZREMRANGEBYSCORE', taken, '-inf', string.format('%d', now))
local memory = tonumber(ARGV[6] or '') or {{TAKEN_MEMORY_MS}}
redis.call('ZADD', taken, string.format('%d', now + memory), id)
if redis.call('PTTL', taken) < memory then redis.call('PEXPIRE', taken, memory) end
redis.call('ZREM', k.claimed, id)
redis.call('ZREM', k.parked, id)
redis.call('HDEL', k.payloads, 'p:' .. id, 'o:' .. id, 't:' .. id)

local expiry = redis.call('ZSCORE', k.holders, id)
if expiry and tonumber(expiry) > now then  -- the reserved permit becomes the run's
  redis.call('ZADD', k.holders, string.format('%d', now + ttl), id)
  redis.call('HSET', k.leases, 'o:' .. id, owner)
  keep_keys(k.holders, k.leases, ttl, now)
  return {STAMP, {1, tonumber(redis.call('HGET', k.leases, 'f:' .. id)), ttl}}
end
if expiry then
  redis.call('ZREM', k.holders, id)
  redis.call('HDEL', k.leases, 'f:' .. id, 'o:' .. id, 's:' .. id)
end
-- No reservation (it lapsed, or Redis lost it): a free permit, unless runs are
-- parked ahead (then this one parks again, behind them).
local limit = stored_limit(k.meta, tonumber(ARGV[4]))
local grace = tonumber(ARGV[5])
if grace then
--!include lib_restart.lua
  local left, marker = restart_grace(k.holders, grace, now_us)
  if left > 0 then hold_for_restart(k.holders, k.leases, limit, left, now, marker) end
end
--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua
if redis.call('ZCARD', k.parked) > 0 or free_for_parked(k, KEYS[5], limit, now) <= 0 then
  -- Remembered (rare: a reservation lapsed), so a re-sent take is refused again.
  if owner ~= '' then redis.call('HSET', k.payloads, 'r:' .. id, owner) end
  return {STAMP, {0}}
end
local fence = next_fence(k.fence, now_us)
grant_permit(k.holders, k.leases, id, owner, ttl, now, fence)
return {STAMP, {1, tonumber(fence), ttl}}
