-- lock_held.lua: is one lease of a lock live? Read-only.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- ARGV[1]  token    the lease's token.
--
-- Returns {stamp, reply}: stamp is 'h' and the first 8 characters of ARGV[1] (see
-- LuaScript in scripts.py). reply is the milliseconds the lease has left (an integer >
-- 0) while it is live, else 0 (unknown, expired, released or taken over).

--!include lib_lock.lua

local STAMP = 'h' .. string.sub(ARGV[1], 1, 8)
local now = server_clock()
local expiry = redis.call('HGET', KEYS[1], 't:' .. ARGV[1])
if expiry and tonumber(expiry) > now then return {STAMP, tonumber(expiry) - now} end
return {STAMP, 0}
