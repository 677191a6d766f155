-- ratelimit_late.lua: a run's body started later than the charge its take left
-- covers (issue #25): the take charges from its own time plus a margin, and a worker
-- process descheduled longer than that between the take's reply and its body let
-- N + 1 bodies start within one period. Its charge moves to the server's now plus a
-- margin (the body started before this call), so no later admission comes within a
-- period of its real start. The take's charge is found in its done key; when it is
-- not there (expired, another owner), the run is charged once more instead, whatever
-- the limiter holds (one more counted than admitted until the earlier charge
-- expires: the safe side).
--
-- KEYS[1]  log      zset: the limiter's charged slots (see lib_ratelimit.lua).
-- KEYS[2]  state    hash: slot costs, totals, penalty, override, born, rates.
-- KEYS[3]  done     string "<owner> <note>": what park_take.lua noted of the take
--                   (capacity_note_taken in lib_capacity.lua); rewritten with the
--                   new charge, so a later call moves it again.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
-- ARGV[2]  spec     the configured rates "L:P[,L:P...]" (limit, period µs); "" uses
--                   the stored ones.
-- ARGV[3]  cost     cost units of the run (int >= 1).
-- ARGV[4]  slots    slots per period (int >= 1).
-- ARGV[5]  seen     server µs the caller was told the state is kept until (0: none).
-- ARGV[6]  spent    "1": a limiter whose state was lost starts as spent.
-- ARGV[7]  margin   µs after the server's now the charge counts from (int >= 0).
-- ARGV[8]  owner    the owner the take sent.
-- Constants (see lib_lock.lua): RELEASE_MEMORY_MS.
--
-- Returns {stamp, {keep, lost, moved}}: stamp is 'L' and the first 8 characters of
-- ARGV[1]; keep the µs the state is kept until (the caller's next `seen`), lost 1
-- when the state was found lost, moved 1 when the take's charge was moved (0: the
-- run was charged once more).

local STAMP = 'L' .. string.sub(ARGV[1], 1, 8)
--!include lib_ratelimit.lua
local now = rl_now()
local cost, slots, owner = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[8]
local _, charged, lost, keep = rl_prepare(KEYS[1], KEYS[2], ARGV[2], slots,
  tonumber(ARGV[5]), tonumber(ARGV[6]), now)
local moved = 0
local taken = redis.call('GET', KEYS[3])
if taken and owner ~= '' and string.sub(taken, 1, #owner + 1) == owner .. ' ' then
  local note = string.sub(taken, #owner + 2)
  if note ~= '' then
    rl_adjust(KEYS[1], KEYS[2], note, cost, -cost, slots, now)
    moved = 1
  end
end
local note = rl_charge(KEYS[1], KEYS[2], charged, cost, slots, now + tonumber(ARGV[7]))
if moved == 1 then
  redis.call('SET', KEYS[3], owner .. ' ' .. note, 'PX', {{RELEASE_MEMORY_MS}})
end
return {STAMP, {keep, lost and 1 or 0, moved}}
