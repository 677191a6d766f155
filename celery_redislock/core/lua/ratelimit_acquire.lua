-- ratelimit_acquire.lua: admit and charge `cost` now if every rate of the limiter
-- admits it, else tell when it will (all or nothing; see lib_ratelimit.lua, issue #25).
-- Also retry_after: the same decision with charge 0, charging nothing.
--
-- KEYS[1]  log      zset: the limiter's charged slots scored by expiry (server µs).
-- KEYS[2]  state    hash: slot costs, period totals, penalty, override, "born".
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
-- ARGV[2]  spec     the configured rates, "L:P[,L:P...]" (limit in cost units, period µs).
-- ARGV[3]  cost     cost units of this call (int >= 1).
-- ARGV[4]  slots    slots per period the charges are recorded in (int >= 1).
-- ARGV[5]  seen     server µs until which an earlier reply said the state is kept
--                   (0: none); a state missing before then was lost.
-- ARGV[6]  spent    1: a limiter whose state was lost starts as spent for one period.
-- ARGV[7]  charge   1: admit and charge when admissible; 0: only tell (retry_after).
--
-- Returns {stamp, reply}: stamp is 'R' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py). reply is {code, now, at, id, keep, lost}: code 1
-- admitted and charged now (id: the admission, for ratelimit_adjust.lua), 0 not
-- (at: the earliest server µs it may be), 2 cost exceeds a limit (at: that limit);
-- now: the server µs; keep: the caller's next `seen`; lost: 1 when this call found
-- the state lost (and, with spent 1, charged the limiter as spent).

local STAMP = 'R' .. string.sub(ARGV[1], 1, 8)
--!include lib_ratelimit.lua
local log, state = KEYS[1], KEYS[2]
local cost, slots = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = rl_now()
local active, charged, lost, keep =
  rl_prepare(log, state, ARGV[2], slots, tonumber(ARGV[5]), tonumber(ARGV[6]), now)
local at = rl_when(log, state, active, cost, now)
local found = lost and 1 or 0
if at < 0 then return {STAMP, {2, now, -at, '', keep, found}} end
if at > now or ARGV[7] ~= '1' then return {STAMP, {0, now, at, '', keep, found}} end
local id = rl_charge(log, state, charged, cost, slots, now)
return {STAMP, {1, now, now, id, keep, found}}
