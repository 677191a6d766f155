-- ratelimit_reset.lua: forget a limiter's charges and penalty (everything is admitted
-- again at once). What an operator or a caller configured stays (issue #25): the
-- override (a live rate an operator set: a reset starts counting afresh, it does
-- not undo that decision -- clear_override does), the configured rates "rates" (by
-- which the CLI and the workers' pumps find the limiter by its name alone: dropped,
-- the limiter vanished from `celery redislock rates` with its override, and its
-- parked runs were pumped by nobody until a new admission stored them again) and
-- the loss marker "born".
--
-- KEYS[1]  log      zset: the limiter's charged slots (deleted).
-- KEYS[2]  state    hash: slot costs, totals, penalty (deleted); override, rates and
--                   "born" kept.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
--
-- Returns {stamp, 1}: stamp is 'Z' and the first 8 characters of ARGV[1].

local STAMP = 'Z' .. string.sub(ARGV[1], 1, 8)
local names = {'born', 'rates', 'override', 'override_until', 'override_text'}
local kept = redis.call('HMGET', KEYS[2], unpack(names))
local ttl = redis.call('PTTL', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
for i, name in ipairs(names) do
  if kept[i] then redis.call('HSET', KEYS[2], name, kept[i]) end
end
if ttl > 0 and redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl) end
return {STAMP, 1}
