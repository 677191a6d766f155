-- journal_put.lua: record a parked run in the park journal (a Redis other than the
-- lock Redis, e.g. the broker's), so it survives the lock Redis restarting empty;
-- drop a few entries whose time is up on the way.
--
-- KEYS[1]  entries   hash: each entry's value (pool, limit, owner and message).
-- KEYS[2]  due       zset: entry ids scored by when they are forgotten (server µs):
--                    their park time plus `keep`, made unique and increasing, so in
--                    park order.
-- ARGV[1]  id        the entry's id (its park token).
-- ARGV[2]  value     opaque bytes: what recovery parks again.
-- ARGV[3]  keep      milliseconds the entry is kept unless dropped before.
--
-- Returns 1. A re-sent put (same id) keeps the entry's first place.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now),
  'LIMIT', 0, 8)
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local due = now + tonumber(ARGV[3]) * 1000
  local tail = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
  if tail and tonumber(tail) >= due then due = tonumber(tail) + 1 end
  redis.call('ZADD', KEYS[2], string.format('%d', due), ARGV[1])
end
return 1
