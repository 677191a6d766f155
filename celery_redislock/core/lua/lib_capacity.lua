-- lib_capacity.lua: the capacity a parking queue hands out, as the parking scripts
-- see it. Inlined by "--!include lib_capacity.lua" after lib_lock.lua,
-- lib_semaphore.lua, lib_restart.lua and lib_ratelimit.lua, before lib_parking.lua.
-- Not a script of its own.
--
-- The queue of parked runs (lib_parking.lua) does not know what frees capacity. A
-- parking script reads its capacity from the end of its KEYS and ARGV
-- (capacity_of) and asks it through the helpers below, which answer by its kind:
--
--   "semaphore"  a RedisSemaphore's free permits (core/parking.py,
--                SemaphoreCapacity). KEYS holders, leases, fence, meta, queue,
--                alive, asks (see lib_semaphore.lua and lib_lock.lua); ARGV
--                "semaphore", limit (integer >= 1), fair ("1": strict FIFO), grace
--                (the restart grace in ms, lib_restart.lua; "" for none). A claimed
--                entry's reservation is a permit lease whose token is the entry's
--                id; a release frees a permit (park_release.lua hands it on).
--   "rate"       a RedisRateLimiter's admissions (core/parking.py, RateCapacity;
--                issue #25): capacity freed by time, not by a release. KEYS log,
--                state (see lib_ratelimit.lua); ARGV "rate", cost (units per run),
--                spec ("L:P,..."), slots, seen (server µs, loss detection; 0:
--                none), spent ("1": a limiter whose state was lost starts spent),
--                as rl_prepare takes them, then optionally ahead (µs a pump may
--                claim before the admission time; 0 or absent: none). A claim
--                is an admission charged when it is claimed -- with ahead, at the
--                admission time it is claimed for, so its run, published ahead by
--                about its way through the broker, starts at that time (a take that
--                comes early is told to wait, capacity_due); a lapsed, returned or
--                dropped claim is refunded while its slots count (capacity_unreserve:
--                the run is charged again when claimed again). A pump at the next
--                admission time (its caller's timer) claims the head.

-- The capacity of a script: KEYS from index `kfirst`, ARGV from `afirst` (see above);
-- nil for a kind these scripts do not know, so the script fails at its first use.
local function capacity_of(keys, kfirst, args, afirst)
  local kind = args[afirst]
  if kind == 'semaphore' then
    return {kind = kind, holders = keys[kfirst], leases = keys[kfirst + 1],
      fence = keys[kfirst + 2], meta = keys[kfirst + 3], queue = keys[kfirst + 4],
      alive = keys[kfirst + 5], asks = keys[kfirst + 6], limit = tonumber(args[afirst + 1]),
      fair = args[afirst + 2] == '1', grace = tonumber(args[afirst + 3] or '')}
  end
  if kind == 'rate' then
    return {kind = kind, log = keys[kfirst], state = keys[kfirst + 1],
      cost = tonumber(args[afirst + 1]), spec = args[afirst + 2],
      slots = tonumber(args[afirst + 3]), seen = tonumber(args[afirst + 4]),
      spent = tonumber(args[afirst + 5]), ahead = tonumber(args[afirst + 6] or '') or 0}
  end
  return nil
end

-- Make the capacity ready for this script: obey the limit stored by the latest
-- acquire or park unless `own` (a park: its caller's limit is obeyed and stored, see
-- capacity_store), and within a restart grace hold the permits of the holders from
-- before the data loss (lib_restart.lua).
local function capacity_ready(c, now, now_us, own)
  if c.kind == 'semaphore' then
    if not own then c.limit = stored_limit(c.meta, c.limit) end
    if c.grace then
      local left, marker = restart_grace(c.holders, c.grace, now_us)
      if left > 0 then hold_for_restart(c.holders, c.leases, c.limit, left, now, marker) end
    end
  elseif c.kind == 'rate' then
    c.now_us = now_us
    c.active, c.charged = rl_prepare(c.log, c.state, c.spec, c.slots, c.seen, c.spent, now_us)
  end
end

-- Remember the terms of a park for the releases and sweepers that pump later (the
-- semaphore's limit, as an acquire stores it).
local function capacity_store(c)
  if c.kind == 'semaphore' then
    redis.call('HSET', c.meta, 'limit', string.format('%d', c.limit))
    redis.call('PEXPIRE', c.meta, {{FENCE_MEMORY_MS}})
  end
end

-- How many parked entries may be claimed now: permits not held by a live lease
-- (expired ones are reaped here) and not due to a run waiting in place in the
-- semaphore's queue (those were woken, or handed a permit, first); 1 when the rate
-- limiter admits a run's cost now (asked again after each claim), else 0 (also
-- before capacity_ready).
local function capacity_free(c, now)
  if c.kind == 'semaphore' then
    reap_holders(c.holders, c.leases, now)
    return c.limit - redis.call('ZCARD', c.holders) - redis.call('ZCARD', c.queue)
  end
  if c.kind == 'rate' and c.active then
    local at = rl_when(c.log, c.state, c.active, c.cost, c.now_us)
    if at >= 0 and at <= c.now_us then return 1 end
  end
  return 0
end

-- The µs a rate claim's note counts from (the earliest end of its slots): its run
-- starting by then is covered by it for a whole period.
local function rl_note_start(note)
  local start
  for member in string.gmatch(note, '[^,]+') do
    local slot = tonumber(string.match(member, ':(%d+)$'))
    if slot and (not start or slot < start) then start = slot end
  end
  return start or 0
end

-- Whether every slot of a rate claim's note still counts at `now_us`.
local function rl_note_live(c, note, now_us)
  for member in string.gmatch(note, '[^,]+') do
    local expiry = redis.call('ZSCORE', c.log, member)
    if not (expiry and tonumber(expiry) > now_us) then return false end
  end
  return true
end

-- How many parked entries may be claimed now (claim_heads): capacity_free, except
-- that a rate limiter with `ahead` also admits a run whose admission time is at
-- most `ahead` µs away, charged at that time (c.at, for capacity_reserve): its run is
-- published now and starts then (#25: a claim charged at the run's start lost the
-- way through the broker, ~10-30 ms, every period).
local function capacity_claimable(c, now)
  if c.kind == 'rate' and c.active and c.ahead > 0 then
    local at = rl_when(c.log, c.state, c.active, c.cost, c.now_us)
    if at >= 0 and at <= c.now_us + c.ahead then
      c.at = math.max(at, c.now_us)
      return 1
    end
    return 0
  end
  return capacity_free(c, now)
end

-- The server µs before which the run of a claimed entry may not start (a rate
-- limiter's claim charged ahead, capacity_claimable: the end of the latest slot its
-- note charged, never before its admission time); 0: it may start now. `claim`: the
-- entry's claim expiry (ms), false when not claimed; `note`: its reservation's note.
local function capacity_due(c, claim, note, now)
  if c.kind ~= 'rate' or c.ahead <= 0 or not note or not (claim and tonumber(claim) > now) then
    return 0
  end
  return rl_note_start(note) - {{START_MARGIN_US}}
end

-- The µs from `now_us` until a run could be claimed (after capacity_ready): a rate
-- limiter's next admission of its cost (0: now; a penalty and an override
-- included), so that its pump sleeps until then without asking again; -1 for a
-- semaphore (a release hands its permits on) or a cost no active rate admits.
local function capacity_next(c, now_us)
  if c.kind ~= 'rate' or not c.active then return -1 end
  local at = rl_when(c.log, c.state, c.active, c.cost, now_us)
  if at < 0 then return -1 end
  return math.max(0, at - now_us)
end

-- Runs waiting for capacity in place, outside the queue (a semaphore's waiters).
local function capacity_waiting(c)
  if c.kind == 'semaphore' then return redis.call('ZCARD', c.queue) end
  return 0
end

-- Reserve capacity for claimed entry `id` (owner `owner`) for `reserve` ms. Returns
-- a note the queue keeps with the entry for capacity_take_reserved and
-- capacity_unreserve (a rate limiter's admission id), or nil.
local function capacity_reserve(c, id, owner, reserve, now, now_us)
  if c.kind == 'semaphore' then
    local fence = next_fence(c.fence, now_us)
    grant_permit(c.holders, c.leases, id, owner, reserve, now, fence)
  elseif c.kind == 'rate' then
    if c.ahead > 0 then -- charged from its admission time on, START_MARGIN_US wide
      local at = (c.at or c.now_us) + {{START_MARGIN_US}}
      c.at = nil
      return rl_charge(c.log, c.state, c.charged, c.cost, c.slots, at)
    end
    return rl_charge(c.log, c.state, c.charged, c.cost, c.slots, c.now_us)
  end
  return nil
end

-- Whether claimed entry `id` holds a reservation (a standby, claimed ahead, holds none;
-- every claim of a rate limiter was charged).
local function capacity_reserved(c, id)
  if c.kind == 'semaphore' then return redis.call('ZSCORE', c.holders, id) ~= false end
  return c.kind == 'rate'
end

-- Drop the reservation of `id` (its claim lapsed, or it was given back); `note`: what
-- capacity_reserve returned (a rate limiter's admission is refunded while it counts).
local function capacity_unreserve(c, id, note, now_us)
  if c.kind == 'semaphore' then
    redis.call('ZREM', c.holders, id)
    redis.call('HDEL', c.leases, 'f:' .. id, 'o:' .. id, 's:' .. id)
  elseif c.kind == 'rate' and note then
    rl_adjust(c.log, c.state, note, c.cost, -c.cost, c.slots, now_us)
  end
end

-- The run of `id` starts: its live reservation becomes its own for `ttl` ms. Returns
-- {fence, ttl}, or nil when it holds none (a lapsed one is dropped; a rate
-- limiter's claim while a penalty holds is refunded). `claim`: the
-- entry's claim expiry (ms) before the take, false when it was not claimed (a rate
-- limiter's reservation is the claim itself; fence 0).
local function capacity_take_reserved(c, id, ttl, owner, now, now_us, claim, note)
  if c.kind == 'rate' then
    if not (claim and tonumber(claim) > now) then return nil end
    if not note then return {0, ttl} end
    if c.ahead > 0 and rl_note_live(c, note, now_us) then
      -- A penalty set since the claim (a run met the API's 429) holds this run back
      -- too: it was admitted before anyone knew the API refuses, and "every worker
      -- holds back" includes it. Its charge is refunded and it is refused (parked
      -- again: park_take.lua finds no free capacity while the penalty holds), to be
      -- admitted when the penalty ends (#29).
      if tonumber(redis.call('HGET', c.state, 'penalty') or 0) > now_us then
        capacity_ready(c, now, now_us, false)
        rl_adjust(c.log, c.state, note, c.cost, -c.cost, c.slots, now_us)
        return nil
      end
      -- Claimed ahead (capacity_claimable), charged from its admission time plus
      -- START_MARGIN_US; capacity_due held the run until its admission time. Its
      -- charge moves to its take plus START_MARGIN_US (the margin for the take's
      -- reply and Celery's hooks before its body starts, as for any take) when that
      -- is later: a period's starts drift by the margin and the wake-up, not by the
      -- way through the broker. A live charge moved later only counts longer, so
      -- nothing is asked again (what the claim decided still holds; asking again
      -- would count the runs claimed ahead after it twice and refuse it).
      c.taken_note = note
      if now_us + {{START_MARGIN_US}} > rl_note_start(note) then
        capacity_ready(c, now, now_us, false)
        rl_adjust(c.log, c.state, note, c.cost, -c.cost, c.slots, now_us)
        c.taken_note = rl_charge(c.log, c.state, c.charged, c.cost, c.slots,
          now_us + {{START_MARGIN_US}})
      end
      return {0, ttl}
    end
    -- The admission moves from the claim to the start, so the limit holds on the
    -- runs' starts (a start comes later than its claim: the way through the broker):
    -- the claim's charge is refunded and the run charged now, if the limiter admits
    -- it now; else the claim's charge is put back and the run refused (it parks
    -- again) -- it started more than a period after its claim, too late to count
    -- there.
    capacity_ready(c, now, now_us, false)
    rl_adjust(c.log, c.state, note, c.cost, -c.cost, c.slots, now_us)
    local at = rl_when(c.log, c.state, c.active, c.cost, now_us)
    if at >= 0 and at <= now_us then
      c.taken_note = rl_charge(c.log, c.state, c.charged, c.cost, c.slots,
        now_us + {{START_MARGIN_US}})
      return {0, ttl}
    end
    rl_adjust(c.log, c.state, note, c.cost, c.cost, c.slots, now_us)
    return nil
  end
  if c.kind == 'semaphore' then
    local expiry = redis.call('ZSCORE', c.holders, id)
    if expiry and tonumber(expiry) > now then
      redis.call('ZADD', c.holders, string.format('%d', now + ttl), id)
      redis.call('HSET', c.leases, 'o:' .. id, owner)
      keep_keys(c.holders, c.leases, ttl, now)
      return {tonumber(redis.call('HGET', c.leases, 'f:' .. id)), ttl}
    end
    if expiry then capacity_unreserve(c, id, nil, now) end
  end
  return nil
end

-- Grant `id` (owner `owner`) capacity for `ttl` ms at once (the caller checked
-- capacity_free). Returns {fence, ttl} (a rate limiter's admission: fence 0).
local function capacity_grant(c, id, owner, ttl, now, now_us)
  if c.kind == 'rate' then
    c.taken_note = rl_charge(c.log, c.state, c.charged, c.cost, c.slots,
      c.now_us + {{START_MARGIN_US}})
    return {0, ttl}
  end
  local fence = next_fence(c.fence, now_us)
  grant_permit(c.holders, c.leases, id, owner, ttl, now, fence)
  return {tonumber(fence), ttl}
end

-- Note that the take of `id` by `owner` was granted, in `done` (kept
-- RELEASE_MEMORY_MS), where a semaphore's lease does not say it: a rate limiter's,
-- as "<owner> <note>", the note being the charge the take left (c.taken_note, set
-- by capacity_take_reserved and capacity_grant), which ratelimit_late.lua moves
-- when the run's body starts later than that charge covers.
local function capacity_note_taken(c, done, owner)
  if c.kind == 'rate' and owner ~= '' then
    redis.call('SET', done, owner .. ' ' .. (c.taken_note or ''), 'PX', {{RELEASE_MEMORY_MS}})
  end
end

-- What a re-sent take of `id` by `owner` got the first time, while it lasts:
-- {fence, ms left}; nil when it got nothing (or it is over). `done`: see
-- capacity_note_taken.
local function capacity_held(c, id, owner, now, done)
  if c.kind == 'rate' and owner ~= '' then
    local taken = redis.call('GET', done)
    if taken and string.sub(taken, 1, #owner + 1) == owner .. ' ' then return {0, 0} end
  end
  if c.kind == 'semaphore' and owner ~= '' then
    local expiry = redis.call('ZSCORE', c.holders, id)
    if expiry and tonumber(expiry) > now and redis.call('HGET', c.leases, 'o:' .. id) == owner then
      return {tonumber(redis.call('HGET', c.leases, 'f:' .. id)), tonumber(expiry) - now}
    end
  end
  return nil
end

-- Give back the capacity `token` holds (a semaphore permit's lease; "" gives back
-- nothing). Returns released (1: it was live), removed (1: it was there, even
-- expired) -- or nil, nil when it was not there at all.
local function capacity_release(c, token, now)
  if c.kind ~= 'semaphore' or token == '' then return 0, 0 end
  local expiry = redis.call('ZSCORE', c.holders, token)
  if not expiry then return nil, nil end
  redis.call('ZREM', c.holders, token)
  redis.call('HDEL', c.leases, 'f:' .. token, 'o:' .. token, 's:' .. token, 'g:' .. token)
  return tonumber(expiry) > now and 1 or 0, 1
end

-- Hand freed capacity to the runs waiting for it in place, first (a semaphore's
-- waiters: granted and told at once, or woken), `removed` being the leases the
-- caller removed already (they count as free for the wake-ups).
local function capacity_hand_on(c, removed, now, now_us)
  if c.kind ~= 'semaphore' then return end
  local head = redis.call('ZRANGE', c.queue, 0, 0)[1]
  local live = redis.call('ZCARD', c.holders)
  local before = eligible(c.queue, c.limit - live - removed, c.fair)
  live = live - reap_holders(c.holders, c.leases, now)
  if head then
    local stale, dropped = reap_dead_waiters(c.queue, c.alive, c.asks, now)
    if dropped > 0 then head = redis.call('ZRANGE', c.queue, 0, 0)[1] end
    local channel = wake_channel(c.holders)
    local free = hand_over_permits(c, c.limit - live, now, now_us, channel, head, stale)
    wake_new(channel, before, eligible(c.queue, free, c.fair), '')
  end
end
