-- ratelimit_adjust.lua: correct an admission's charge after the call (e.g. an API's
-- real token count): a refund lowers the admission's own slots, an extra charge
-- raises them (rl_adjust in lib_ratelimit.lua, issue #25). Answered once per nonce:
-- a re-sent call gets the first answer and moves nothing again.
--
-- KEYS[1]  log      zset: the limiter's charged slots scored by expiry (server µs).
-- KEYS[2]  state    hash: slot costs and period totals (see lib_ratelimit.lua).
-- KEYS[3]  done     string "<base>:done:<nonce>": this call's answer, kept 10 min.
-- KEYS[4]  adjusted hash "<base>:adjusted:<admission µs>:<id>": slot member -> the
--                   units the admission's earlier adjusts moved there (bounds a
--                   refund), kept while its slots count.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply, names done).
-- ARGV[2]  id       the admission: its slots, as ratelimit_acquire.lua returned them.
-- ARGV[3]  cost     cost units the admission was charged when admitted.
-- ARGV[4]  delta    cost units to add (> 0) or refund (< 0); int, not 0.
-- ARGV[5]  slots    slots per period, for an extra charge past the admission's slots.
--
-- Returns {stamp, moved}: stamp is 'J' and the first 8 characters of ARGV[1];
-- moved the cost units added (> 0) or refunded (< 0) in the admission's last slot.

local STAMP = 'J' .. string.sub(ARGV[1], 1, 8)
local done = redis.call('GET', KEYS[3])
if done then return {STAMP, tonumber(done)} end
--!include lib_ratelimit.lua
local now = rl_now()
local moved = rl_adjust(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), now, KEYS[4])
redis.call('SET', KEYS[3], string.format('%d', moved), 'PX', 600000)
return {STAMP, moved}
