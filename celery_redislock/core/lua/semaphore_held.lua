-- semaphore_held.lua: is one lease of a semaphore live? Read-only.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- ARGV[1]  token    the lease's token.
--
-- Returns {stamp, reply}: stamp is 'h' and the first 8 characters of ARGV[1] (see
-- LuaScript in scripts.py). reply is the milliseconds the lease has left (an integer >
-- 0) while it is live, else 0 (unknown, expired, released or taken over).

--!include lib_lock.lua

local STAMP = 'h' .. string.sub(ARGV[1], 1, 8)
local now = server_clock()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now then return {STAMP, tonumber(expiry) - now} end
return {STAMP, 0}
