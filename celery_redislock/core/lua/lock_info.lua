-- lock_info.lua: read a lock's state without changing anything.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    optional: zset of waiters by heartbeat deadline; when given,
--                   only waiters whose heartbeat has not lapsed are counted.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
--
-- Returns {stamp, reply}: stamp is 'i' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {now_ms, {field, value, ...} of the holders hash, number of waiters}.
-- Leases whose expiry has passed are reported as they are; the caller skips them.

local STAMP = 'i' .. string.sub(ARGV[1], 1, 8)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waiters
if KEYS[3] then
  waiters = redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf')
else
  waiters = redis.call('ZCARD', KEYS[2])
end
return {STAMP, {now, redis.call('HGETALL', KEYS[1]), waiters}}
