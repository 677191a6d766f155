-- lib_parking.lua: helpers inlined into the parking scripts by
-- "--!include lib_parking.lua", after lib_lock.lua and lib_semaphore.lua. Not a
-- script of its own.
--
-- A pool's parked runs live next to its semaphore (same hash tag). The payload of
-- each is opaque bytes to these scripts. An entry's id is its park token; it is in
-- exactly one of these states:
--   parked    in the parked zset, scored by ticket (server µs at park: FIFO order);
--             its payload "p:<id>", owner "o:<id>" and ticket "t:<id>" in payloads.
--   claimed   taken off the queue by a release (or a pump) that reserved a permit
--             for it: a lease of the semaphore whose token is the id, and the id in
--             the claimed zset scored by the reservation's expiry (server ms); or
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

-- The parking keys of a script, by name.
local function parking_keys(holders, leases, fence, meta, parked, payloads, claimed)
  return {holders = holders, leases = leases, fence = fence, meta = meta,
    parked = parked, payloads = payloads, claimed = claimed}
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
-- place (their ticket), dropping the reservation's lease if it is still there.
-- Returns how many were put back.
local function unclaim_lapsed(k, now)
  local lapsed = redis.call('ZRANGEBYSCORE', k.claimed, '-inf', string.format('%d', now))
  for _, id in ipairs(lapsed) do
    redis.call('ZREM', k.claimed, id)
    redis.call('ZREM', k.holders, id)
    redis.call('HDEL', k.leases, 'f:' .. id, 'o:' .. id, 's:' .. id)
    local ticket = redis.call('HGET', k.payloads, 't:' .. id)
    if ticket then redis.call('ZADD', k.parked, ticket, id) end
  end
  return #lapsed
end

-- Claim up to `free` entries from the head of the queue: each gets a permit reserved
-- for `reserve` ms (a lease whose token is its id) and joins the claimed zset.
-- Returns {id, payload, owner, ...} of the entries claimed, in queue order.
local function claim_heads(k, free, now, now_us, reserve)
  local out = {}
  while free > 0 do
    local head = redis.call('ZRANGE', k.parked, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', k.parked, head)
    local row = redis.call('HMGET', k.payloads, 'p:' .. head, 'o:' .. head)
    if row[1] then  -- else its payload expired with the hash: nothing to publish
      local fence = next_fence(k.fence, now_us)
      grant_permit(k.holders, k.leases, head, row[2] or '', reserve, now, fence)
      redis.call('ZADD', k.claimed, string.format('%d', now + reserve), head)
      out[#out + 1] = head
      out[#out + 1] = row[1]
      out[#out + 1] = row[2] or ''
      free = free - 1
    end
  end
  if #out > 0 then
    local keep = redis.call('PTTL', k.payloads)
    if keep < reserve + 1000 then keep = reserve + 1000 end
    redis.call('PEXPIRE', k.claimed, keep)
  end
  return out
end

-- Permits free for parked runs under `limit`: not held by a live lease (expired ones
-- are reaped here) and not due to a run waiting in place in the semaphore's queue
-- (those were woken, or handed a permit, first).
local function free_for_parked(k, queue, limit, now)
  reap_holders(k.holders, k.leases, now)
  return limit - redis.call('ZCARD', k.holders) - redis.call('ZCARD', queue)
end

-- Claim ahead, without a permit, as many queue heads as make `standby` runs waiting
-- in place or on their way to (claimed entries that hold no reserved lease -- a
-- standby's run waits in place before it takes its token -- or the semaphore's
-- waiters, whichever are more); each claim lapses after `reserve` ms if its run never
-- takes its token.
-- Returns {id, payload, owner, ...} as claim_heads does.
local function claim_standbys(k, queue, standby, now, reserve)
  if standby <= 0 or redis.call('EXISTS', k.parked) == 0 then return {} end
  local ahead = 0
  for _, id in ipairs(redis.call('ZRANGE', k.claimed, 0, -1)) do
    if not redis.call('ZSCORE', k.holders, id) then ahead = ahead + 1 end
  end
  -- A standby waits in place before it takes its token, so its entry stays claimed
  -- (a run killed while it waits is published again): it is counted once.
  local waiting = redis.call('ZCARD', queue)
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
  if #out > 0 then  -- the claimed zset lives as long as the payloads it points to
    local keep = redis.call('PTTL', k.payloads)
    if keep < reserve + 1000 then keep = reserve + 1000 end
    redis.call('PEXPIRE', k.claimed, keep)
  end
  return out
end
