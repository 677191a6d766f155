-- journal_drop.lua: forget a parked run in the park journal (its run starts, or it
-- was dead-lettered): recovery will never park it again.
--
-- KEYS[1]  entries   hash: each entry's value (see journal_put.lua).
-- KEYS[2]  due       zset: entry ids scored by when they are forgotten (server µs).
-- ARGV[1]  id        the entry's id (its park token).
--
-- Returns 1 when the entry was there, else 0 (also for a re-sent drop).

redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
