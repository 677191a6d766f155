-- ratelimit_override.lua: set or clear a limiter's temporary rate override, which
-- every admission honours instead of the configured rates until it expires (a live
-- change without a deploy; issue #25). Counting goes on in the configured periods
-- meanwhile, so they hold again as soon as the override ends.
--
-- KEYS[1]  state    hash: "override" (a rate spec), "override_until" (server µs),
--                   "override_text" (the rate as its caller wrote it).
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
-- ARGV[2]  spec     the override's rates, "L:P[,L:P...]" (limit, period µs); "" clears.
-- ARGV[3]  text     the override as written (shown by info); ignored when clearing.
-- ARGV[4]  ttl      µs the override lasts from the server's now (int >= 1).
--
-- Returns {stamp, until}: stamp is 'O' and the first 8 characters of ARGV[1]; until
-- the server µs the override ends (0 when cleared).

local STAMP = 'O' .. string.sub(ARGV[1], 1, 8)
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'override', 'override_until', 'override_text')
  return {STAMP, 0}
end
--!include lib_ratelimit.lua
local now = rl_now()
local ends = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'override', ARGV[2], 'override_until', string.format('%d', ends),
  'override_text', ARGV[3])
rl_keep(KEYS[1], ends, now)
return {STAMP, ends}
