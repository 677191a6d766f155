-- semaphore_renew.lua: renew many semaphore leases in one call (the renewal thread's
-- batch); the same rule as semaphore_extend.lua for each: never revives an expired
-- permit. Expired leases are left to the next acquire, release or extend to reap
-- (they wake waiters, which needs keys this batch does not have).
--
-- N leases, two keys each; N = #ARGV / 2. In Redis Cluster every key of one call
-- shares a slot.
--
-- KEYS[2i-1]   holders  zset of lease i's semaphore: tokens scored by expiry (ms).
-- KEYS[2i]     leases   hash of lease i's semaphore: fence, owner, grant time.
-- ARGV[i]      token    lease i's token, i = 1..N.
-- ARGV[1]      (lease 1's token, as above, also stamps the reply)
-- ARGV[2N + i] gen     optional: lease i's generation when the renewal was composed
--                      (0 when left out).
-- ARGV[N + i]  ttl      lease i's new lease time from now, milliseconds (integer > 0).
-- ARGV[3N + i] fence    optional (with owner and grace, and gen then given): lease i's
--                       fence, 0 when it is not to be put back after a data loss.
-- ARGV[4N + i] owner    optional: lease i's owner id.
-- ARGV[5N + i] grace    optional: lease i's restart grace, ms (see restart_grace in
--                       lib_restart.lua).
-- ARGV[6N + i] limit    with grace: the limit of lease i's semaphore; a lease is put
--                       back only after the placeholders are filled to it, in one's
--                       place (see hold_for_restart), so never more than the limit.
--
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS.
--
-- Returns {stamp, reply}: stamp is 'N' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is an array of N integers: 1 when lease i was live and now expires ttl ms
-- from now, 2 when it is live but an explicit extend with a newer generation set its
-- TTL (left as it is), 0 when it was not (unknown, expired or released), 3 when it was
-- missing because Redis lost its data after the lease was granted (the boot marker is
-- missing or newer than its fence) and was put back within the restart grace, in a
-- placeholder's place (see hold_for_restart and reregister_permit; else 0). Within
-- a grace each lease given a fence also raises its semaphore's fence key (the
-- holders key, "holders" replaced by "fence") to it: see raise_fence. A
-- re-sent call renews again and changes nothing else.

--!include lib_lock.lua
--!include lib_semaphore.lua

local n = #KEYS / 2
local gens = #ARGV >= 3 * n
local back = #ARGV == 7 * n
local STAMP = 'N' .. string.sub(ARGV[1], 1, 8)
local now, now_us = server_clock()
local renewed = {}
for i = 1, n do
  local holders, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local token, ttl = ARGV[i], tonumber(ARGV[n + i])
  local expiry = redis.call('ZSCORE', holders, token)
  renewed[i] = 0
  local gen = tonumber(redis.call('HGET', leases, 'g:' .. token) or 0)
  if gen > 0 and gen > (gens and tonumber(ARGV[2 * n + i]) or 0) then
    if expiry and tonumber(expiry) > now then renewed[i] = 2 end
  elseif expiry and tonumber(expiry) > now then
    redis.call('ZADD', holders, 'XX', string.format('%d', now + ttl), token)
    keep_keys(holders, leases, ttl, now)
    renewed[i] = 1
  elseif back and not expiry and tonumber(ARGV[3 * n + i]) > 0 then
--!include lib_restart.lua
    local fence = tonumber(ARGV[3 * n + i])
    local left, marker = restart_grace(holders, tonumber(ARGV[5 * n + i]), now_us)
    if left > 0 then
      raise_fence(holders, ARGV[3 * n + i])
      hold_for_restart(holders, leases, tonumber(ARGV[6 * n + i]), left, now, marker)
    end
    -- Only within the grace: past it (a flush or an evicted marker on a server older
    -- than the grace declares none) newcomers were not held off, and a lease put back
    -- would be one over the limit.
    if left > 0 and tonumber(marker) > fence and reregister_permit(holders, leases,
        token, ARGV[4 * n + i], ttl, now, ARGV[3 * n + i], marker) then
      renewed[i] = 3
    end
  end
end
return {STAMP, renewed}
