-- lock_extend.lua: reset one live lease's TTL; never re-creates an expired lock.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  ttl      new lease time from now, milliseconds (integer > 0).
--
-- Returns 1 when the lease was live and now expires ttl ms from now, 0 when it was
-- not ours (unknown, expired or released).

--!include lib_lock.lua

local holders = KEYS[1]
local token, ttl = ARGV[1], tonumber(ARGV[2])
local now = server_clock()
if not live_fence(holders, token, now) then return 0 end

redis.call('HSET', holders, 't:' .. token, string.format('%d', now + ttl))
if redis.call('HLEN', holders) <= 5 then
  redis.call('PEXPIRE', holders, ttl)  -- the only lease: the key follows it
else
  sweep_leases(holders, now)  -- re-entered: the key follows the longest lease
end
return 1
