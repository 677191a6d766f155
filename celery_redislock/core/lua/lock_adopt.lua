-- lock_adopt.lua: hand a live lease over to a new token (e.g. producer -> worker).
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  fence    string: last fence granted.
-- ARGV[1]  old      token of the lease handed over (e.g. from a message header).
-- ARGV[2]  token    the new lease's random token.
-- ARGV[3]  ttl      the new lease's time, milliseconds (integer > 0).
-- ARGV[4]  memory   how long the fence key outlives a grant, milliseconds.
--
-- Returns {1, fence} when the old lease was live: it is gone and the new one holds
-- the lock with a new fence; also when the new token already holds it (a re-sent
-- call). Returns {0, 0} when the old lease is not live (handed over already, or
-- expired): the caller does not hold the lock.

--!include lib_lock.lua

local holders, fence_key = KEYS[1], KEYS[2]
local old, token, ttl, memory = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, now_us = server_clock()

local mine = live_fence(holders, token, now)
if mine then return {1, mine} end
if not live_fence(holders, old, now) then return {0, 0} end

local fence = next_fence(fence_key, now_us, memory)
redis.call('HDEL', holders, 't:' .. old, 'f:' .. old)
redis.call('HSET', holders, 'fence', fence, 't:' .. token, string.format('%d', now + ttl),
  'f:' .. token, fence)
if redis.call('HLEN', holders) <= 5 then
  redis.call('PEXPIRE', holders, ttl)
else
  sweep_leases(holders, now)
end
return {1, tonumber(fence)}
