-- redelivered_take.lua: another message of a parked run whose park token was consumed
-- already (park_take.lua answered "duplicate"): is its first run alive, ended, or dead?
-- A dead one's message is the run now (#24): it takes a permit under the entry's id.
--
-- KEYS[1]  holders   zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases    hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  fence     string: last fence granted.
-- KEYS[4]  meta      hash: "limit", the limit the latest acquire enforced.
-- KEYS[5]  queue     zset: runs waiting in place (semaphore waiters), read only.
-- KEYS[6]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[7]  payloads  hash: parked entries' payloads (see lib_parking.lua), read only:
--                    "r:<id>" says the take of the id was refused (park_take.lua), so
--                    its run parked again under another id (or, a standby, runs on
--                    the permit it waited for until KEYS[10] names it).
-- KEYS[8]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[9]  taken     zset: consumed ids scored by when they are forgotten (ms).
-- KEYS[10] run       string "<prefix>:semaphore:{name}:run:<id>": "ran" once the run
--                    of the entry ended, "p <owner>" once the message of ARGV[3]
--                    `owner` was told to park again under another id ({-3}), or
--                    "l <token>" when it runs on a permit of another token (a standby
--                    handed one while it waited in place); none: its permit is the
--                    lease whose token is the id.
-- ARGV[1]  id        the run's park token (its message header).
-- ARGV[2]  ttl       the run's lease time, milliseconds (integer > 0).
-- ARGV[3]  owner     owner id recorded with the run's permit.
-- ARGV[4]  limit     the caller's limit (integer >= 1), used when meta holds none.
-- ARGV[5]  memory    milliseconds KEYS[10] is kept when this call writes it.
-- ARGV[6]  grace     optional: the restart grace, ms (see restart_grace in
--                    lib_restart.lua). Empty or absent: none.
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS.
--
-- Returns {stamp, reply} (stamp: 'rt' and the first 8 characters of ARGV[1]); reply:
-- {-2}          the id was never consumed (call park_take.lua);
-- {-1}          its run ended, or was parked again (here, or refused at its take):
--               this message must not run;
-- {0, ms}       its run's permit is live, `ms` more unless renewed: alive, or dead
--               since less than a lease (look again after `ms`: renewed = alive);
-- {-3}          its run is dead, but no permit is free: the caller parks this
--               message again under a new id (the old one is marked so: a further
--               message gets {-1}, this call re-sent {-3} again);
-- {1, fence, ttl}  its run is dead (its permit lapsed unrenewed): this message is the
--               run now, on a permit whose token is the id (so a further message
--               finds it live). A re-sent call (same id and owner, its reply lost)
--               answers as the first did while that permit is live.

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_restart.lua
--!include lib_ratelimit.lua
--!include lib_capacity.lua

local STAMP = 'rt' .. string.sub(ARGV[1], 1, 8)
-- The semaphore's permits, as the parking scripts see them (see lib_capacity.lua).
local k = {kind = 'semaphore', holders = KEYS[1], leases = KEYS[2], fence = KEYS[3],
  meta = KEYS[4], queue = KEYS[5]}
local id, ttl, owner, run = ARGV[1], tonumber(ARGV[2]), ARGV[3], KEYS[10]
local now, now_us = server_clock()

if not redis.call('ZSCORE', KEYS[9], id) then return {STAMP, {-2}} end
local mark = redis.call('GET', run)
if mark == 'ran' then return {STAMP, {-1}} end
if mark and string.sub(mark, 1, 2) == 'p ' then  -- parked again by the call below
  -- That call re-sent (its reply lost) answers as it did; any other is dropped.
  if owner ~= '' and string.sub(mark, 3) == owner then return {STAMP, {-3}} end
  return {STAMP, {-1}}
end
-- Refused at its take: the run parked again under a new id, whose entry runs it.
if not mark and redis.call('HEXISTS', KEYS[7], 'r:' .. id) == 1 then return {STAMP, {-1}} end
local token = id
if mark and string.sub(mark, 1, 2) == 'l ' then token = string.sub(mark, 3) end
local expiry = redis.call('ZSCORE', k.holders, token)
if expiry and tonumber(expiry) > now then
  if token == id and owner ~= '' and redis.call('HGET', k.leases, 'o:' .. id) == owner then
    return {STAMP, {1, tonumber(redis.call('HGET', k.leases, 'f:' .. id)), tonumber(expiry) - now}}
  end
  return {STAMP, {0, tonumber(expiry) - now}}
end
if expiry then  -- lapsed, not reaped yet: its holder stopped renewing it
  redis.call('ZREM', k.holders, token)
  redis.call('HDEL', k.leases, 'f:' .. token, 'o:' .. token, 's:' .. token, 'g:' .. token)
end
k.limit = stored_limit(k.meta, tonumber(ARGV[4]))
local grace = tonumber(ARGV[6] or '')
if grace then
  local left, marker = restart_grace(k.holders, grace, now_us)
  if left > 0 then hold_for_restart(k.holders, k.leases, k.limit, left, now, marker) end
end
if capacity_free(k, now) <= 0 then
  redis.call('SET', run, 'p ' .. owner, 'PX', ARGV[5])
  return {STAMP, {-3}}
end
local fence = next_fence(k.fence, now_us)
grant_permit(k.holders, k.leases, id, owner, ttl, now, fence)
redis.call('DEL', run)
return {STAMP, {1, tonumber(fence), ttl}}
