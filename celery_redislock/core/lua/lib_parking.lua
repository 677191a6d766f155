-- lib_parking.lua: helpers inlined into the parking scripts by
-- "--!include lib_parking.lua", after lib_capacity.lua. Not a script of its own.
--
-- A pool's parked runs live next to the capacity they wait for (same hash tag),
-- which these helpers know only through lib_capacity.lua: what frees it (a release,
-- time) is the capacity's business. The payload of each entry is opaque bytes to
-- these scripts. An entry's id is its park token; it is in exactly one of these
-- states:
--   parked    in the parked zset, scored by ticket (server µs at park: FIFO order);
--             its payload "p:<id>", owner "o:<id>" and ticket "t:<id>" in payloads
--             (and "n:<id>" once claimed: the capacity's note of its reservation,
--             see capacity_reserve).
--   claimed   taken off the queue by a release (or a pump) that reserved capacity
--             for it (capacity_reserve: a semaphore's permit lease whose token is
--             the id), and the id in the claimed zset scored by the reservation's
--             expiry (server ms); or
--             claimed ahead as a *standby*, without a permit: its run starts early and
--             waits in place (a semaphore waiter), so the next release hands it the
--             permit with no broker round trip (claim_standbys). The
--             payload stays until the run starts, so an entry whose publisher died,
--             or whose message never started within the reservation, is put back at
--             its old place (unclaim_lapsed) and claimed again.
--   taken     the run started and consumed the id (park_take.lua): its payload is
--             gone and the id is remembered in the taken zset for TAKEN_MEMORY_MS,
--             so a second message of the same entry is known as a duplicate.
-- Constants (written into the text at load): {{TAKEN_MEMORY_MS}}; park.lua also
-- SENT_WINDOW_US (how far before its parking a sender's clock may place a run).

-- The queue's keys of a script (KEYS[1] to KEYS[5] of every parking script), by name;
-- "reserve" in payloads is the latest park's reservation time (ms).
local function parking_keys(keys)
  return {parked = keys[1], payloads = keys[2], claimed = keys[3], taken = keys[4],
    dead = keys[5]}
end

-- Append to `reply` {id, payload, owner} of each entry of `ids` (space-separated, as
-- a done key holds them) that is still claimed: what a re-sent request answers.
local function append_still_claimed(reply, ids, payloads, claimed)
  for id in string.gmatch(ids, '%S+') do
    local row = redis.call('HMGET', payloads, 'p:' .. id, 'o:' .. id)
    if row[1] and redis.call('ZSCORE', claimed, id) then
      reply[#reply + 1] = id
      reply[#reply + 1] = row[1]
      reply[#reply + 1] = row[2] or ''
    end
  end
  return reply
end

-- Put the claimed entries whose reservation lapsed back on the queue at their old
-- place (their ticket), dropping the reservation if it is still there.
-- Returns how many were put back.
local function unclaim_lapsed(k, c, now)
  local lapsed = redis.call('ZRANGEBYSCORE', k.claimed, '-inf', string.format('%d', now))
  for _, id in ipairs(lapsed) do
    redis.call('ZREM', k.claimed, id)
    capacity_unreserve(c, id, redis.call('HGET', k.payloads, 'n:' .. id), now * 1000)
    redis.call('HDEL', k.payloads, 'n:' .. id)
    local ticket = redis.call('HGET', k.payloads, 't:' .. id)
    if ticket then redis.call('ZADD', k.parked, ticket, id) end
  end
  return #lapsed
end

-- The claimed zset lives as long as the payloads it points to.
local function keep_claimed(k, reserve)
  local keep = redis.call('PTTL', k.payloads)
  if keep < reserve + 1000 then keep = reserve + 1000 end
  redis.call('PEXPIRE', k.claimed, keep)
end

-- Claim entries from the head of the queue while capacity is free (asked again once
-- what it said is used up): each gets capacity reserved for `reserve` ms
-- (capacity_reserve) and joins the claimed zset.
-- Returns {id, payload, owner, ...} of the entries claimed, in queue order.
local function claim_heads(k, c, now, now_us, reserve)
  local out = {}
  local free = capacity_claimable(c, now)
  while free > 0 do
    local head = redis.call('ZRANGE', k.parked, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', k.parked, head)
    local row = redis.call('HMGET', k.payloads, 'p:' .. head, 'o:' .. head)
    if row[1] then  -- else its payload expired with the hash: nothing to publish
      local note = capacity_reserve(c, head, row[2] or '', reserve, now, now_us)
      if note then redis.call('HSET', k.payloads, 'n:' .. head, note) end
      redis.call('ZADD', k.claimed, string.format('%d', now + reserve), head)
      out[#out + 1] = head
      out[#out + 1] = row[1]
      out[#out + 1] = row[2] or ''
      free = free - 1
      if free == 0 then free = capacity_claimable(c, now) end
    end
  end
  if #out > 0 then keep_claimed(k, reserve) end
  return out
end

-- Claim ahead, without a reservation, as many queue heads as make `standby` runs
-- waiting in place or on their way to (claimed entries that hold no reservation -- a
-- standby's run waits in place before it takes its token -- or the runs waiting in
-- place for the capacity, whichever are more); each claim lapses after `reserve` ms
-- if its run never takes its token.
-- Returns {id, payload, owner, ...} as claim_heads does.
local function claim_standbys(k, c, standby, now, reserve)
  if standby <= 0 or redis.call('EXISTS', k.parked) == 0 then return {} end
  local ahead = 0
  for _, id in ipairs(redis.call('ZRANGE', k.claimed, 0, -1)) do
    if not capacity_reserved(c, id) then ahead = ahead + 1 end
  end
  -- A standby waits in place before it takes its token, so its entry stays claimed
  -- (a run killed while it waits is published again): it is counted once.
  local waiting = capacity_waiting(c)
  if waiting > ahead then ahead = waiting end
  local out = {}
  while ahead < standby do
    local head = redis.call('ZRANGE', k.parked, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', k.parked, head)
    local row = redis.call('HMGET', k.payloads, 'p:' .. head, 'o:' .. head)
    if row[1] then
      redis.call('ZADD', k.claimed, string.format('%d', now + reserve), head)
      out[#out + 1] = head
      out[#out + 1] = row[1]
      out[#out + 1] = row[2] or ''
      ahead = ahead + 1
    end
  end
  if #out > 0 then keep_claimed(k, reserve) end
  return out
end

-- Claim for the capacity free now (claim_heads), then the standbys
-- (claim_standbys): {id, payload, owner, ...} of both, in that order.
local function claim_free(k, c, standby, now, now_us, reserve)
  local out = claim_heads(k, c, now, now_us, reserve)
  for _, v in ipairs(claim_standbys(k, c, standby, now, reserve)) do out[#out + 1] = v end
  return out
end
