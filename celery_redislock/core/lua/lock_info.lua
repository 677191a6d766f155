-- lock_info.lua: read a lock's state without changing anything.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
--
-- Returns {now_ms, {field, value, ...} of the holders hash, number of waiters}.
-- Leases whose expiry has passed are reported as they are; the caller skips them.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1]), redis.call('ZCARD', KEYS[2])}
