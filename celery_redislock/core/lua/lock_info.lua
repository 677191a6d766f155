-- lock_info.lua: read a lock's state without changing anything.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
--
-- Returns {stamp, reply}: stamp is 'i' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {now_ms, {field, value, ...} of the holders hash, number of waiters}.
-- Leases whose expiry has passed are reported as they are; the caller skips them.

local STAMP = 'i' .. string.sub(ARGV[1], 1, 8)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {STAMP, {now, redis.call('HGETALL', KEYS[1]), redis.call('ZCARD', KEYS[2])}}
