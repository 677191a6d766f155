-- lib_ratelimit.lua: the rate limiter's admission logic (see core/ratelimit.py, issue
-- #25), inlined by "--!include lib_ratelimit.lua" into the ratelimit_*.lua scripts and
-- into any other script that admits runs by a limiter (the Celery side's parking
-- scripts). Not a script of its own. Every time is the server's clock in µs.
--
-- One limiter's state is two keys sharing its hash tag (KeySpace kind "ratelimit"):
--   log    zset: one member per (period, slot) charged, "<period µs>:<slot end µs>",
--          scored by its expiry (slot end + period). A slot is a period/slots wide
--          span of server time; an admission is recorded at the END of its slot, so
--          it counts a little longer than a period, never shorter: at most N in any
--          window of a period, whatever the slot width (a sliding log whose memory is
--          at most slots + 1 members per period, not N).
--   state  hash: "c:<member>" the cost charged to that slot; "t:<period µs>" the
--          total of that period's live slots; "penalty" the server µs before which
--          nobody is admitted; "override" a rate spec replacing the configured one
--          until "override_until" (µs), "override_text" as its caller wrote it;
--          "born" the µs the limiter was first seen (loss detection, rl_prepare);
--          "rates" the configured spec its last caller sent (for tools that know
--          only the limiter's name: an empty spec in a call means this one).
-- A rate spec is "L:P[,L:P...]": limit L (cost units) per period P (µs), e.g.
-- "10:1000000,500:60000000" for ["10/s", "500/m"] (core/ratelimit_rates.py, wire()).
--
-- Interface for other scripts (keys: log, state; `now` from rl_now()):
--   local now = rl_now()
--   local active, charged, lost, keep, spec =
--     rl_prepare(log, state, spec, slots, seen, spent, now)
--       once, first: drops expired slots, applies a live override (active: the rates
--       that admit; charged: every period any configured or active rate counts),
--       detects lost state (lost: true; see rl_prepare) and returns `keep`, the µs
--       until which the state is kept (the caller's next `seen`; 0 to skip detection),
--       and the configured spec (the stored one when `spec` is '').
--   rl_when(log, state, active, cost, now) -> t
--       the earliest µs at which `cost` is admitted (<= now: now; penalty included);
--       -L when cost exceeds limit L of an active rate (never admissible).
--   rl_charge(log, state, charged, cost, slots, now) -> admission id
--       admit and charge now (after rl_prepare in the same script, and only when
--       rl_when(...) <= now, or the limit may be exceeded): the id
--       (comma-separated members) is what rl_adjust corrects later.
--   rl_keep(key, keep, now)  keeps a key written outside these helpers until `keep` µs.
-- From Python, RateLimitScripts (core/ratelimit_scripts.py) gives a limiter's keys
-- (.keys: log, state) and lib_args() = {spec, slots, seen, spent}; pass rl_prepare's
-- `keep` back in the reply to its kept(keep), so the loss of this state is noticed.

-- The server's clock in µs.
local function rl_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The rates of a spec "L:P,...", as a list of {limit, period} pairs.
local function rl_parse(spec)
  local rates = {}
  for limit, period in string.gmatch(spec, '(%d+):(%d+)') do
    rates[#rates + 1] = {tonumber(limit), tonumber(period)}
  end
  return rates
end

-- Drop the slots expired by `now`, lowering their periods' totals (each slot is
-- added once and dropped once: constant work per admission, in chunks of 500 for
-- unpack's argument limit).
local function rl_trim(log, state, now)
  local until_now = string.format('%d', now)
  while true do
    local gone = redis.call('ZRANGEBYSCORE', log, '-inf', until_now, 'LIMIT', 0, 500)
    if #gone == 0 then return end
    local fields = {}
    for i, member in ipairs(gone) do fields[i] = 'c:' .. member end
    local costs = redis.call('HMGET', state, unpack(fields))
    local totals = {}
    for i, member in ipairs(gone) do
      local period = string.match(member, '^(%d+):')
      totals[period] = (totals[period] or 0) + (tonumber(costs[i]) or 0)
    end
    for period, cost in pairs(totals) do
      if cost ~= 0 then
        redis.call('HINCRBY', state, 't:' .. period, string.format('%d', -cost))
      end
    end
    redis.call('HDEL', state, unpack(fields))
    redis.call('ZREM', log, unpack(gone))
  end
end

-- Charge `cost` to `period`'s slot of `now` (width period/slots, aligned on the
-- server's clock so every client shares the slots); returns the member and its expiry.
local function rl_charge_period(log, state, period, cost, slots, now)
  local width = math.max(1, math.floor(period / slots))
  local rest = math.fmod(now, width) -- exact for integers below 2^53, unlike now / width
  local slot = now - rest
  if rest > 0 then slot = slot + width end
  local member = string.format('%d:%d', period, slot)
  local expiry = slot + period
  redis.call('ZADD', log, string.format('%d', expiry), member)
  redis.call('HINCRBY', state, 'c:' .. member, string.format('%d', cost))
  redis.call('HINCRBY', state, 't:' .. string.format('%d', period), string.format('%d', cost))
  return member, expiry
end

-- Keep `key` until at least `keep` µs (never shortened; a missing key is left alone).
local function rl_keep(key, keep, now)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left * 1000 < keep - now) then
    redis.call('PEXPIREAT', key, string.format('%d', math.ceil(keep / 1000)))
  end
end

-- Keep both keys a day past the `longest` period charged, each renewed once less
-- than 23 hours past it are left (most calls only read the TTLs): the log never
-- expires while its slots count (a state kept longer by a penalty or an override
-- only holds totals the next walk corrects, see rl_freed_at), and an idle limiter's
-- keys go away by themselves. Returns a time (µs) both are kept until at least.
local function rl_hold(log, state, longest, now)
  local floor = longest + 82800000000
  for _, key in ipairs({state, log}) do
    local left = redis.call('PTTL', key)
    if left == -1 or (left >= 0 and left * 1000 < floor) then
      redis.call('PEXPIREAT', key, string.format('%d', math.ceil((now + floor) / 1000) + 3600000))
    end
  end
  return now + floor
end

-- A log just made (no expiry yet) expires as rl_hold's would.
local function rl_hold_log(log, longest, now)
  if redis.call('PTTL', log) == -1 then
    redis.call('PEXPIREAT', log,
      string.format('%d', math.ceil((now + longest + 82800000000) / 1000) + 3600000))
  end
end

-- See the interface above. `seen`: the `keep` an earlier call returned to this
-- caller (0: none); `spent`: 1 to start a limiter whose state was lost as spent.
-- Lost state: "born" is missing while a caller was told the state is kept past now
-- (Redis restarted empty, flushed, or the keys evicted): lost is true, and with
-- `spent` 1 every configured and active rate is charged up to its limit now, so no
-- burst passes for one period. A caller that never saw the state cannot tell a loss
-- from a new limiter.
local function rl_prepare(log, state, spec, slots, seen, spent, now)
  local fields = redis.call('HMGET', state, 'born', 'override', 'override_until', 'rates')
  if spec == '' then
    spec = fields[4] or ''
  elseif spec ~= fields[4] then
    redis.call('HSET', state, 'rates', spec) -- for tools that know only the name
  end
  local configured = rl_parse(spec)
  local active = configured
  if fields[2] then
    if tonumber(fields[3]) > now then
      active = rl_parse(fields[2])
    else
      redis.call('HDEL', state, 'override', 'override_until', 'override_text')
    end
  end
  local charged, known, longest = {}, {}, 0
  for _, rates in ipairs({configured, active}) do
    for _, rate in ipairs(rates) do
      if not known[rate[2]] then
        known[rate[2]] = true
        charged[#charged + 1] = rate[2]
        if rate[2] > longest then longest = rate[2] end
      end
    end
  end
  rl_trim(log, state, now)
  local lost = false
  if not fields[1] then
    redis.call('HSET', state, 'born', string.format('%d', now))
    lost = seen > now
    if lost and spent == 1 then
      for _, rates in ipairs({configured, active}) do
        for _, rate in ipairs(rates) do
          local total = tonumber(redis.call('HGET', state, 't:' .. string.format('%d', rate[2])) or 0)
          if total < rate[1] then
            rl_charge_period(log, state, rate[2], rate[1] - total, slots, now)
          end
        end
      end
    end
  end
  -- The state outlives the longest period by a day (rl_hold), so a caller's `seen`
  -- (this keep) tells a loss from an idle limiter whose keys expired.
  local keep = rl_hold(log, state, longest, now)
  return active, charged, lost, keep, spec
end

-- The server µs at which the slots of `period` expired by then add up to `need`.
-- nil when the log does not back `need` (a key evicted alone): the period's total is
-- then corrected to what the log holds.
local function rl_freed_at(log, state, period, need, now)
  local prefix = string.format('%d:', period)
  local freed, offset = 0, 0
  while true do
    local chunk = redis.call('ZRANGEBYSCORE', log, string.format('(%d', now), '+inf',
      'WITHSCORES', 'LIMIT', offset, 200)
    for i = 1, #chunk, 2 do
      local member = chunk[i]
      if string.sub(member, 1, #prefix) == prefix then
        freed = freed + tonumber(redis.call('HGET', state, 'c:' .. member) or 0)
        if freed >= need then return tonumber(chunk[i + 1]) end
      end
    end
    if #chunk < 400 then
      redis.call('HSET', state, 't:' .. string.format('%d', period), string.format('%d', freed))
      return nil
    end
    offset = offset + 200
  end
end

-- See the interface above.
local function rl_when(log, state, active, cost, now)
  local fields = {'penalty'}
  for i, rate in ipairs(active) do fields[i + 1] = 't:' .. string.format('%d', rate[2]) end
  local values = redis.call('HMGET', state, unpack(fields))
  local at = tonumber(values[1] or 0)
  if at < now then at = now end
  for i, rate in ipairs(active) do
    local limit = rate[1]
    if cost > limit then return -limit end
    local total, freed = tonumber(values[i + 1] or 0), now
    for _ = 1, 2 do -- twice when the first walk corrected the total
      if total + cost <= limit then break end
      freed = rl_freed_at(log, state, rate[2], total + cost - limit, now)
      if freed then break end
      freed, total = now, tonumber(redis.call('HGET', state, fields[i + 1]) or 0)
    end
    if freed > at then at = freed end
  end
  return at
end

-- See the interface above.
local function rl_charge(log, state, charged, cost, slots, now)
  local members, longest = {}, 0
  for i, period in ipairs(charged) do
    members[i] = rl_charge_period(log, state, period, cost, slots, now)
    if period > longest then longest = period end
  end
  -- rl_prepare held both keys; a log made just now has no expiry yet.
  rl_hold_log(log, longest, now)
  return table.concat(members, ',')
end

-- Correct the admission `id` (rl_charge's) by `delta` cost units: a refund (delta < 0)
-- lowers each of its slots, never below 0 nor by more than the admission was charged
-- there: `cost` plus its extra charges less its refunds, kept per slot in the hash
-- `adjusted` (#25: a refund bounded by its cost alone, repeated, gave back the units
-- of other admissions sharing the slot, and more than N passed in a period); with
-- `adjusted` nil, by `cost` alone (a caller that refunds an admission at most once
-- between charges, as lib_capacity.lua does). An extra charge (delta > 0) goes to
-- its slots while they live, else to the slots of `now`. A refund of an expired slot
-- changes nothing (it counts no more). Returns the cost units moved in its last slot
-- (0: none).
local function rl_adjust(log, state, id, cost, delta, slots, now, adjusted)
  local moved, longest, live_until = 0, 0, 0
  for member in string.gmatch(id, '[^,]+') do
    local period = string.match(member, '^(%d+):')
    local change = 0
    local expiry = redis.call('ZSCORE', log, member)
    if expiry then
      change = delta
      if delta < 0 then
        local left = tonumber(redis.call('HGET', state, 'c:' .. member) or 0)
        local net = adjusted and tonumber(redis.call('HGET', adjusted, member) or 0) or 0
        change = math.min(0, math.max(delta, -(cost + net), -left))
      end
      if change ~= 0 then
        redis.call('HINCRBY', state, 'c:' .. member, string.format('%d', change))
        redis.call('HINCRBY', state, 't:' .. period, string.format('%d', change))
        if adjusted then redis.call('HINCRBY', adjusted, member, string.format('%d', change)) end
      end
      if tonumber(expiry) > live_until then live_until = tonumber(expiry) end
    elseif delta > 0 then
      rl_charge_period(log, state, tonumber(period), delta, slots, now)
      change = delta
    end
    moved = change
    if tonumber(period) > longest then longest = tonumber(period) end
  end
  if adjusted and live_until > 0 and redis.call('EXISTS', adjusted) == 1 then
    -- Kept while its slots count: past then a refund changes nothing anyway.
    redis.call('PEXPIREAT', adjusted, string.format('%d', math.ceil(live_until / 1000) + 1000))
  end
  rl_hold_log(log, longest, now)
  return moved
end
