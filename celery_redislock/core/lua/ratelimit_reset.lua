-- ratelimit_reset.lua: forget a limiter's charges and penalty (everything is admitted
-- again at once); its override and its loss marker "born" stay (issue #25).
--
-- KEYS[1]  log      zset: the limiter's charged slots (deleted).
-- KEYS[2]  state    hash: slot costs, totals, penalty (deleted); override and "born" kept.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
--
-- Returns {stamp, 1}: stamp is 'Z' and the first 8 characters of ARGV[1].

local STAMP = 'Z' .. string.sub(ARGV[1], 1, 8)
local names = {'born', 'override', 'override_until', 'override_text'}
local kept = redis.call('HMGET', KEYS[2], unpack(names))
local ttl = redis.call('PTTL', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
for i, name in ipairs(names) do
  if kept[i] then redis.call('HSET', KEYS[2], name, kept[i]) end
end
if ttl > 0 and redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl) end
return {STAMP, 1}
