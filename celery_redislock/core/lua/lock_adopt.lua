-- lock_adopt.lua: hand a live lease over to a new token (e.g. producer -> worker).
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  fence    string: last fence granted.
-- ARGV[1]  old      token of the lease handed over (e.g. from a message header).
-- ARGV[2]  token    the new lease's random token.
-- ARGV[3]  ttl      the new lease's time, milliseconds (integer > 0).
-- ARGV[4]  owner    new owner id of the lock, or "" to keep the current one.
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS.
--
-- Returns {1, fence} when the old lease was live: it is gone and the new one holds
-- the lock with a new fence. Returns {0, 0} when the old lease is not live (handed
-- over already, or expired) and also when the new token is live already: the new
-- token may be derived from the old one by the caller, and a second hand-over of
-- the same message (a broker redelivery) must not share the first one's lease.

--!include lib_lock.lua

local holders, fence_key = KEYS[1], KEYS[2]
local old, token, ttl, owner = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, now_us = server_clock()

-- One read for both leases' expiries: the new token must not be live, the old must.
local expiries = redis.call('HMGET', holders, 't:' .. token, 't:' .. old)
local function live(expiry) return expiry and tonumber(expiry) > now end
if live(expiries[1]) or not live(expiries[2]) then return {0, 0} end

local fence = next_fence(fence_key, now_us)
redis.call('HDEL', holders, 't:' .. old, 'f:' .. old)
local expiry = string.format('%d', now + ttl)
local fields = {'fence', fence, 't:' .. token, expiry, 'f:' .. token, fence}
if owner ~= '' then
  fields[#fields + 1] = 'owner'
  fields[#fields + 1] = owner
end
redis.call('HSET', holders, unpack(fields))
if redis.call('HLEN', holders) <= 5 then
  redis.call('PEXPIREAT', holders, expiry)
else
  sweep_leases(holders, now, true)
end
return {1, tonumber(fence)}
