-- lock_renew.lua: renew many lock leases in one call (the renewal thread's batch);
-- the same rule as lock_extend.lua for each: never re-creates an expired lock.
--
-- N leases, one key each; N = #ARGV / 2. Several leases may name the same key (an
-- owner's re-entered leases). In Redis Cluster every key of one call shares a slot.
--
-- KEYS[i]      holders  hash of lease i's lock (see lock_acquire.lua), i = 1..N.
-- ARGV[i]      token    lease i's token.
-- ARGV[1]      (lease 1's token, as above, also stamps the reply)
-- ARGV[2N + i] gen     optional: lease i's generation when the renewal was composed
--                      (0 when left out).
-- ARGV[N + i]  ttl      lease i's new lease time from now, milliseconds (integer > 0).
-- ARGV[3N + i] fence    optional (with owner and grace, and gen then given): lease i's
--                       fence, 0 when it is not to be put back after a data loss.
-- ARGV[4N + i] owner    optional: lease i's owner id.
-- ARGV[5N + i] grace    optional: lease i's restart grace, ms (see lib_restart.lua).
-- ARGV[6N + i] limit    optional: ignored (the batch's semaphore leases' limits).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS.
--
-- Returns {stamp, reply}: stamp is 'n' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is an array of N integers: 1 when lease i was live and now expires ttl ms
-- from now, 2 when it is live but an explicit extend with a newer generation set its
-- TTL (left as it is), 0 when it was not ours (unknown, expired or released), 3 when it
-- was missing because Redis lost its data after it was granted (the boot marker is
-- missing or newer than its fence) and was put back within the restart grace (see
-- reregister_lock). A re-sent call renews again and changes nothing else.

--!include lib_lock.lua

local n = #KEYS
local gens = #ARGV >= 3 * n
local back = #ARGV >= 6 * n
local STAMP = 'n' .. string.sub(ARGV[1], 1, 8)
local now, now_us = server_clock()
local renewed = {}
for i = 1, n do
  local gen = tonumber(redis.call('HGET', KEYS[i], 'g:' .. ARGV[i]) or 0)
  if gen > 0 and gen > (gens and tonumber(ARGV[2 * n + i]) or 0) then
    local expiry = redis.call('HGET', KEYS[i], 't:' .. ARGV[i])
    renewed[i] = (expiry and tonumber(expiry) > now) and 2 or 0
  else
    renewed[i] = extend_lease(KEYS[i], ARGV[i], tonumber(ARGV[n + i]), now)
    if renewed[i] == 0 and back and tonumber(ARGV[3 * n + i]) > 0
        and redis.call('HEXISTS', KEYS[i], 't:' .. ARGV[i]) == 0 then
--!include lib_restart.lua
      -- Only within the grace (as for a permit, see semaphore_renew.lua): past it a
      -- free lock was not held off from newcomers.
      local left, marker = restart_grace(KEYS[i], tonumber(ARGV[5 * n + i]), now_us)
      if left > 0 then raise_fence(KEYS[i], ARGV[3 * n + i]) end
      if left > 0 and tonumber(marker) > tonumber(ARGV[3 * n + i]) then
        renewed[i] = 3 * reregister_lock(KEYS[i], ARGV[i], ARGV[4 * n + i],
          tonumber(ARGV[n + i]), now, ARGV[3 * n + i])
      end
    end
  end
end
return {STAMP, renewed}
