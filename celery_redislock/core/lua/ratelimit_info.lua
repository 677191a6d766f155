-- ratelimit_info.lua: a limiter's state for the CLI and for callers: the rates that
-- admit now, what each counts, the next admission, penalty and override (issue #25).
-- Drops expired slots and notes a lost state as an admission does (rl_prepare).
--
-- KEYS[1]  log      zset: the limiter's charged slots scored by expiry (server µs).
-- KEYS[2]  state    hash: slot costs, period totals, penalty, override, "born".
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
-- ARGV[2]  spec     the configured rates, "L:P[,L:P...]" (limit in cost units, period µs);
--                   "": the rates its last admitting caller configured (stored).
-- ARGV[3]  cost     cost units the next admission is computed for (int >= 1).
-- ARGV[4]  slots    slots per period (int >= 1).
-- ARGV[5]  seen     as for ratelimit_acquire.lua (µs; 0: none).
-- ARGV[6]  spent    as for ratelimit_acquire.lua (1 or 0).
--
-- Returns {stamp, reply}: stamp is 'N' and the first 8 characters of ARGV[1]. reply
-- is {now, at, penalty, override_text, override_until, {limit, period, used, ...},
-- keep, spec, lost}: now the server µs; at the earliest µs `cost` is admitted (a negative -L: it
-- exceeds limit L); penalty its end (µs, 0: none); the override ("" and 0: none); for
-- each active rate its limit, period (µs) and the cost units charged in its window;
-- keep and lost as ratelimit_acquire.lua's; spec the configured rates (ARGV[2] or the
-- stored).

local STAMP = 'N' .. string.sub(ARGV[1], 1, 8)
--!include lib_ratelimit.lua
local log, state = KEYS[1], KEYS[2]
local now = rl_now()
local active, _, lost, keep, spec = rl_prepare(log, state, ARGV[2], tonumber(ARGV[4]),
  tonumber(ARGV[5]), tonumber(ARGV[6]), now)
local at = rl_when(log, state, active, tonumber(ARGV[3]), now)
local fields = redis.call('HMGET', state, 'penalty', 'override_text', 'override_until')
local rows = {}
for _, rate in ipairs(active) do
  rows[#rows + 1] = rate[1]
  rows[#rows + 1] = rate[2]
  rows[#rows + 1] = tonumber(redis.call('HGET', state, 't:' .. string.format('%d', rate[2])) or 0)
end
local penalty = tonumber(fields[1] or 0)
if penalty <= now then penalty = 0 end
local ends = 0
if fields[2] then ends = tonumber(fields[3]) end
return {STAMP, {now, at, penalty, fields[2] or '', ends, rows, keep, spec, lost and 1 or 0}}
