-- lock_adopt.lua: hand a live lease over to a new token (e.g. producer -> worker).
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  fence    string: last fence granted.
-- ARGV[1]  old      token of the lease handed over (e.g. from a message header).
-- ARGV[2]  token    the new lease's random token.
-- ARGV[3]  ttl      the new lease's time, milliseconds (integer > 0).
-- KEYS[3]  done     string "<prefix>:lock:{name}:done:<nonce>": written when this call
--                   hands the lease over, kept RELEASE_MEMORY_MS, so a re-send of
--                   the call (its reply lost) is told the lease it made.
-- ARGV[4]  owner    new owner id of the lock, or "" to keep the current one.
-- ARGV[5]  nonce    a fresh random string per call (names KEYS[3]).
-- Constants (see lib_lock.lua): FENCE_MEMORY_MS, RELEASE_MEMORY_MS.
--
-- Returns {stamp, reply}: stamp is 'd' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {1, fence, ms_left} when the old lease was live: it is gone and the new
-- one holds the lock with a new fence (and to a re-send of this call while the new
-- lease lives: ms_left is the TTL it has left). Returns {0, 0} when the old lease is not live (handed
-- over already, or expired) and also when the new token is live already: the new
-- token may be derived from the old one by the caller, and a second hand-over of
-- the same message (a broker redelivery, another call: another nonce) must not share
-- the first one's lease.

--!include lib_lock.lua

local holders, fence_key = KEYS[1], KEYS[2]
local old, token, ttl, owner = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local STAMP = 'd' .. string.sub(ARGV[1], 1, 8)
local now, now_us = server_clock()

if redis.call('EXISTS', KEYS[3]) == 1 then  -- this call adopted already: a re-send
  local fence, left = live_fence(holders, token, now)
  if fence then return {STAMP, {1, fence, left}} end
  return {STAMP, {0, 0}}
end

-- One read for both leases' expiries: the new token must not be live, the old must.
local expiries = redis.call('HMGET', holders, 't:' .. token, 't:' .. old)
local function live(expiry) return expiry and tonumber(expiry) > now end
if live(expiries[1]) or not live(expiries[2]) then return {STAMP, {0, 0}} end

local fence = next_fence(fence_key, now_us)
redis.call('HDEL', holders, 't:' .. old, 'f:' .. old, 'g:' .. old)
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
redis.call('SET', KEYS[3], '1', 'PX', {{RELEASE_MEMORY_MS}})
return {STAMP, {1, tonumber(fence), ttl}}
