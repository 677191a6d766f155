-- lib_lock.lua: helpers inlined into the lock scripts by "--!include lib_lock.lua".
-- Not a script of its own: a script gets only the helpers it calls (scripts.py).
-- Numbers go to Redis through %d: Lua's tostring would print a microsecond clock as
-- 1.7e+15.
--
-- Constants, written into the text at load (scripts.py) from their Python definitions:
-- {{FENCE_MEMORY_MS}}      how long the fence key outlives a grant, milliseconds
--                          (lock.py).
-- {{WAITER_HEARTBEAT_MS}}  a waiter's heartbeat, milliseconds: it is dropped from the
--                          queue when it has not called again within this time
--                          (waiting.py).

-- The server's clock: milliseconds and microseconds since the epoch. (Each string
-- read as a number once: a tonumber of a string is a strtod, a large part of a
-- short script's own time.)
local function server_clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Next fence of a name: max(last + 1, now in µs), so fences keep increasing even
-- if the fence key (kept FENCE_MEMORY_MS after each grant) is lost. One SET ... GET
-- (Redis >= 6.2) when the clock is ahead of the last fence, as it nearly always is.
-- Returns the fence as text (to store) and as a number (to answer).
local function next_fence(fence_key, now_us)
  local fence, n = string.format('%d', now_us), now_us
  local last = redis.call('SET', fence_key, fence, 'PX', {{FENCE_MEMORY_MS}}, 'GET')
  if last then
    last = tonumber(last)
    if last >= now_us then
      n = last + 1
      fence = string.format('%d', n)
      redis.call('SET', fence_key, fence, 'PX', {{FENCE_MEMORY_MS}})
    end
  end
  return fence, n
end

-- Drop expired leases of a holders hash; fit its expiry to the longest live lease
-- (or delete it). Returns the number of live leases and the longest expiry (ms).
-- With `refit` false the expiry is fitted only when a lease was dropped: for a
-- caller that changed no lease (a refused attempt), whose key already follows its
-- longest lease; a write costs several reads inside a script.
local function sweep_leases(holders, now, refit)
  local fields = redis.call('HGETALL', holders)
  local live, longest, dropped = 0, 0, false
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 't:' then
      local expiry = tonumber(fields[i + 1])
      if expiry <= now then
        local t = string.sub(name, 3)
        redis.call('HDEL', holders, name, 'f:' .. t, 'g:' .. t)
        dropped = true
      else
        live = live + 1
        if expiry > longest then longest = expiry end
      end
    end
  end
  if live == 0 then
    redis.call('DEL', holders)
  elseif dropped or refit then
    redis.call('PEXPIREAT', holders, string.format('%d', longest))
  end
  return live, longest
end

-- Live lease of `token` in a holders hash: its fence and the ms it has left, or nil.
local function live_fence(holders, token, now)
  local expiry = redis.call('HGET', holders, 't:' .. token)
  if expiry and tonumber(expiry) > now then
    return tonumber(redis.call('HGET', holders, 'f:' .. token)), tonumber(expiry) - now
  end
  return nil
end

-- Reset the live lease of `token` in a holders hash to expire `ttl` ms after `now`;
-- the key's expiry follows its longest lease. An expired or unknown lease (or key)
-- is never re-created. Returns 1 when the lease was live, else 0.
local function extend_lease(holders, token, ttl, now)
  local expiry = redis.call('HGET', holders, 't:' .. token)
  if not expiry or tonumber(expiry) <= now then return 0 end
  expiry = string.format('%d', now + ttl)
  redis.call('HSET', holders, 't:' .. token, expiry)
  if redis.call('HLEN', holders) <= 5 then
    redis.call('PEXPIREAT', holders, expiry)  -- the only lease: the key follows it
  else
    sweep_leases(holders, now, true)  -- re-entered: the key follows the longest lease
  end
  return 1
end

-- The wake-up channel of a lock or semaphore, derived from its holders key (every
-- script that wakes waiters has it as KEYS[1]) rather than sent with each call: the
-- key's name with its last part "holders" replaced by "wake", e.g.
-- "redislock:lock:{name}:wake". KeySpace.channel (keys.py) is the same rule. A
-- channel name is not a key: publishing on it touches no key.
local function wake_channel(holders)
  return string.sub(holders, 1, -8) .. 'wake'
end

-- Where and how waiter `token` listens: `channel`, or `channel:<tag>` when the token
-- ends in ".<tag>" (its process's own channel, so other processes sleep on); and
-- true when the tag starts with "s": that process listens with SSUBSCRIBE (sharded
-- pub/sub on Redis Cluster >= 7, see pubsub.py), so it is told with SPUBLISH, which
-- only the shard serving the channel's slot (this lock's) carries.
local function waiter_channel(channel, token)
  local tag = string.match(token, '%.(%w+)$')
  if not tag then return channel, false end
  return channel .. ':' .. tag, string.sub(tag, 1, 1) == 's'
end

-- Publish `message` to waiter `token`, on its channel and the way it listens. A node
-- without sharded pub/sub (Redis < 7, a cluster in the middle of an upgrade) answers
-- SPUBLISH with an error: caught (a script stopped half-way would leave its writes
-- done and its caller told it failed); PUBLISH instead.
local function tell(channel, token, message)
  local where, sharded = waiter_channel(channel, token)
  if sharded then
    local sent = redis.pcall('SPUBLISH', where, message)
    if type(sent) == 'number' then return end
  end
  redis.call('PUBLISH', where, message)
end

-- Tell waiter `token` it may go on (the lock is free, or a permit is due to it).
local function notify(channel, token)
  tell(channel, token, token)
end

-- Make `token` a waiter: a heartbeat deadline WAITER_HEARTBEAT_MS from now each time;
-- the first time also a ticket (the server's µs clock, bumped past the tail so the
-- order is strict) and its request ("<ttl ms> <owner>" in the asks hash, so a release
-- can grant it directly; a semaphore waiter's "<ttl ms>:<limit> <owner>", `limit`
-- being the limit it acquires under, so a release grants it a permit under its own
-- limit, not under the stored one of whoever acquired last). The three keys always hold the same tokens (a waiter enters
-- and leaves all three in one script), so the ZADD to alive, which counts the members
-- it added, tells whether the token is queued already. `given`, when not nil, is the
-- ticket itself (a Redlock waiter's, the same on every master, so every master's
-- queue has the same order and the same head; ties go by token).
local function enqueue_waiter(queue, alive, asks, token, ttl, owner, now, now_us, given, limit)
  local beat = {{WAITER_HEARTBEAT_MS}}
  if redis.call('ZADD', alive, string.format('%d', now + beat), token) == 1 then
    local ticket = given or now_us
    if not given then
      local tail = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
      if tail[2] and tonumber(tail[2]) >= ticket then ticket = tonumber(tail[2]) + 1 end
    end
    redis.call('ZADD', queue, string.format('%d', ticket), token)
    local ask = string.format('%d', ttl)
    if limit then ask = ask .. ':' .. string.format('%d', limit) end
    redis.call('HSET', asks, token, ask .. ' ' .. owner)
  end
  -- The keys outlive every heartbeat deadline by a heartbeat, so dead waiters never
  -- leave them behind. Refreshed only when due (a PTTL read is cheaper than a write):
  -- a key just made has none, else at most once a second. The three are made and
  -- refreshed together (same tokens, same expiry), so the queue's TTL stands for all.
  if redis.call('PTTL', queue) < beat * 2 - 1000 then
    for _, key in ipairs({queue, alive, asks}) do redis.call('PEXPIRE', key, beat * 2) end
  end
end

-- Take `token` out of the wait queue (it was granted, or gave up).
local function dequeue_waiter(queue, alive, asks, token)
  redis.call('ZREM', queue, token)
  redis.call('ZREM', alive, token)
  redis.call('HDEL', asks, token)
end

-- The request of waiter `token`, a queued token that reap_dead_waiters (same `now`)
-- left in the queue, if it may be granted directly: it checked in within the last
-- half heartbeat (live waiters poll every second), so it is almost surely there to
-- use the grant; `stale` is the set of those that did not (from reap_dead_waiters).
-- Returns its ttl (ms), owner and limit (a semaphore waiter's; nil for a lock's), or
-- nil.
local function fresh_ask(asks, token, stale)
  if stale[token] then return nil end
  local ask = redis.call('HGET', asks, token)
  if not ask then return nil end
  local ttl, limit, owner = string.match(ask, '^(%d+):?(%d*) (.*)$')
  return tonumber(ttl), owner, tonumber(limit)
end

-- True when a connection listens on the channel of waiter `token` (see
-- waiter_channel). Only then may a release grant the waiter its lease and announce it
-- ("<token> <fence>", see tell): a killed process has no subscriber left (its
-- connection closed), so a dead waiter is never handed a lease it would hold for a
-- whole TTL (it stays queued until its heartbeat lapses). PUBSUB SHARDNUMSUB counts
-- the subscribers of the whole cluster (they all subscribe on this shard); on Redis
-- Cluster PUBSUB NUMSUB counts this node's only: a classic waiter listening through
-- another node is woken instead (announcing a grant that was not written would make
-- two holders).
local function listening(channel, token)
  local where, sharded = waiter_channel(channel, token)
  -- pcall: SHARDNUMSUB is unknown before Redis 7 (see tell): nobody listens sharded.
  local counts = redis.pcall('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', where)
  return counts[2] ~= nil and counts[2] > 0
end

-- Drop waiters whose heartbeat lapsed (they died without leaving the queue). Returns
-- the set of the waiters left that did not check in within the last half heartbeat
-- (not fresh, see fresh_ask; nearly always empty: read by the same call), and the
-- number of waiters dropped.
local function reap_dead_waiters(queue, alive, asks, now)
  local rows = redis.call('ZRANGEBYSCORE', alive, '-inf',
    string.format('(%d', now + {{WAITER_HEARTBEAT_MS}} / 2), 'WITHSCORES')
  local stale, dropped = {}, 0
  for i = 1, #rows, 2 do
    if tonumber(rows[i + 1]) <= now then
      dequeue_waiter(queue, alive, asks, rows[i])
      dropped = dropped + 1
    else
      stale[rows[i]] = true
    end
  end
  return stale, dropped
end

-- reap_dead_waiters, returning the queue's first token before and after.
local function reap_waiters(queue, alive, asks, now)
  local before = redis.call('ZRANGE', queue, 0, 0)[1]
  local _, dropped = reap_dead_waiters(queue, alive, asks, now)
  if dropped == 0 then return before, before end
  return before, redis.call('ZRANGE', queue, 0, 0)[1]
end

-- Grant a free lock to `token` as its first lease, with fence `fence`. The key
-- expires at the lease's expiry itself (PEXPIREAT: also cheaper than PEXPIRE, which
-- Redis rewrites into a PEXPIREAT for replication on every call).
local function grant_lock(holders, token, owner, ttl, now, fence)
  local expiry = string.format('%d', now + ttl)
  redis.call('HSET', holders, 'owner', owner, 'since', string.format('%d', now),
    'fence', fence, 't:' .. token, expiry, 'f:' .. token, fence)
  redis.call('PEXPIREAT', holders, expiry)
end
