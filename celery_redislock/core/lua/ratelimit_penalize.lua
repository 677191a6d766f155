-- ratelimit_penalize.lua: nobody is admitted by the limiter before the server's now
-- plus `wait` (an API's 429 Retry-After, for every process; issue #25). A longer
-- penalty already set stays.
--
-- KEYS[1]  state    hash: "penalty", the server µs before which nobody is admitted.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
-- ARGV[2]  wait     µs from the server's now (int >= 0).
--
-- Returns {stamp, {now, until}}: stamp is 'P' and the first 8 characters of ARGV[1];
-- now the server µs, until the penalty's end (µs) after this call.

local STAMP = 'P' .. string.sub(ARGV[1], 1, 8)
--!include lib_ratelimit.lua
local now = rl_now()
local wanted = now + tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', KEYS[1], 'penalty') or 0)
if wanted > current then
  redis.call('HSET', KEYS[1], 'penalty', string.format('%d', wanted))
  current = wanted
end
rl_keep(KEYS[1], current, now)
return {STAMP, {now, current}}
