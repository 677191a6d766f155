-- lib_semaphore.lua: helpers inlined into the semaphore scripts by
-- "--!include lib_semaphore.lua", after lib_lock.lua. Not a script of its own.
--
-- A semaphore's live leases are the members of its holders zset whose score (expiry,
-- server ms) is in the future; the leases hash keeps "f:<token>" (fence),
-- "o:<token>" (owner) and "s:<token>" (granted at, server ms) for each of them. Both
-- keys expire no earlier than the longest lease (see keep_keys), and vanish once
-- emptied.
--
-- Wake-ups: the waiters allowed to take a permit are the first `free` tokens of the
-- queue (free = limit - holders), or only its head when fair (strict FIFO: grants
-- follow the queue order one by one). Each script that changes holders, limit or
-- queue publishes the tokens that entered that set, and only those: no herd. (When
-- not fair, others may also barge in: see semaphore_acquire.lua.)

-- Drop expired leases and their details. Returns how many were dropped.
local function reap_holders(holders, leases, now)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', string.format('%d', now))
  for _, t in ipairs(expired) do
    redis.call('ZREM', holders, t)
    redis.call('HDEL', leases, 'f:' .. t, 'o:' .. t, 's:' .. t, 'g:' .. t)
  end
  return #expired
end

-- The waiters allowed to take one of `free` permits: the first `free` of the queue,
-- or its head alone when `fair`.
local function eligible(queue, free, fair)
  if free <= 0 then return {} end
  if fair then free = 1 end
  return redis.call('ZRANGE', queue, 0, free - 1)
end

-- Notify each token of `after` that is not in `before` (nor `skip`).
local function wake_new(channel, before, after, skip)
  local told = {}
  for _, t in ipairs(before) do told[t] = true end
  for _, t in ipairs(after) do
    if not told[t] and t ~= skip then notify(channel, t) end
  end
end

-- The limit stored with the semaphore, else `default`.
local function stored_limit(meta, default)
  return tonumber(redis.call('HGET', meta, 'limit')) or default
end

-- Make the holders zset and leases hash outlive a lease of `ttl` ms from `now`. When
-- due they are set to outlive it by a second more, so the grants of the next second
-- (of leases no longer) find them long enough and only read a TTL: a write costs
-- several reads inside a script.
local function keep_keys(holders, leases, ttl, now)
  if redis.call('PTTL', holders) < ttl then
    local at = string.format('%d', now + ttl + 1000)
    redis.call('PEXPIREAT', holders, at)
    redis.call('PEXPIREAT', leases, at)
  end
end

-- Add a lease of `ttl` ms for `token` (owner id `owner`) with fence `fence`.
local function grant_permit(holders, leases, token, owner, ttl, now, fence)
  redis.call('ZADD', holders, string.format('%d', now + ttl), token)
  redis.call('HSET', leases, 'f:' .. token, fence, 'o:' .. token, owner,
    's:' .. token, string.format('%d', now))
  keep_keys(holders, leases, ttl, now)
end

-- Hand up to `free` permits straight to the first waiters of the queue, in order,
-- starting with `head` (the queue's first token, or nil): each fresh one (see
-- fresh_ask; `stale` from reap_dead_waiters) that listens (see listening) is
-- granted one here and told "<token> <fence>", so the hand-off costs it no round
-- trip. A waiter is granted only while fewer leases than its own limit are live (the
-- limit it asked under: one client with a higher limit having acquired last must not
-- make the release admit more than the waiters allow). Stops at the first waiter not
-- granted so (it is woken, or reaped, as before). `here`, when not nil, is the
-- caller's own waiter tag: a waiter of that tag (the caller's event loop, alive as it
-- calls) is granted without the freshness and listening checks and without a
-- message; "<token>
-- <fence>" is appended to the list `granted` instead, which the caller answers to
-- that loop. Returns the permits left.
local function hand_over_permits(keys, free, now, now_us, channel, head, stale, here, granted)
  local mine_suffix = here and ('.' .. here)
  while free > 0 and head do
    local mine = mine_suffix and string.sub(head, -#mine_suffix) == mine_suffix
    -- The caller's own waiter is there (its loop is calling) however late its last
    -- check-in: no freshness asked of it.
    local ttl, owner, limit = fresh_ask(keys.asks, head, mine and {} or stale)
    if not ttl then break end
    if limit and redis.call('ZCARD', keys.holders) >= limit then break end
    if not mine and not listening(channel, head) then break end
    local fence = next_fence(keys.fence, now_us)
    dequeue_waiter(keys.queue, keys.alive, keys.asks, head)
    grant_permit(keys.holders, keys.leases, head, owner, ttl, now, fence)
    if mine then
      granted[#granted + 1] = head .. ' ' .. fence
    else
      tell(channel, head, head .. ' ' .. fence)
    end
    free = free - 1
    if free > 0 then head = redis.call('ZRANGE', keys.queue, 0, 0)[1] end
  end
  return free
end
