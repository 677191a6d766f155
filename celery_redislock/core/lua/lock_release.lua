-- lock_release.lua: give up one lease of a lock, owner-checked by token.
--
-- KEYS[1]  holders  hash of the lock's live leases (see lock_acquire.lua).
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- ARGV[1]  token    the lease's token.
-- ARGV[2]  channel  wake-up channel: when the lock becomes free, the token of the
--                   first live waiter is published there, or on `channel:<tag>` when
--                   the token ends in ".<tag>" (also when the lease had expired and
--                   left the lock free, so the waiter need not poll).
--
-- Returns 1 when the lease was live and is now released, 0 when it was not ours
-- (unknown, expired, already released): a re-sent release changes nothing (it may
-- only repeat the wake-up message).

--!include lib_lock.lua

local holders, queue, alive = KEYS[1], KEYS[2], KEYS[3]
local token, channel = ARGV[1], ARGV[2]

local expiry = redis.call('HGET', holders, 't:' .. token)
if not expiry then
  -- Not ours (any more). If our lease expired and left the lock free, the head of
  -- the queue may be asleep for a whole poll: wake it. Nothing else changes.
  if redis.call('EXISTS', holders) == 0 then
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head then notify(channel, head) end
  end
  return 0
end

-- Five fields (owner, since, fence and this lease's t: and f:): the only lease. The
-- key expires with it (every script sets both from one clock reading), so the key
-- being there means the lease is live: no clock reading needed, the key goes whole.
-- More fields: other leases of the same owner (re-entry) may keep the lock held.
local now, live = nil, 0
if redis.call('HLEN', holders) > 5 then
  now = server_clock()
  redis.call('HDEL', holders, 't:' .. token, 'f:' .. token)
  live = sweep_leases(holders, now)
end
if live == 0 then
  redis.call('DEL', holders)
  if redis.call('EXISTS', queue) == 1 then
    now = now or server_clock()
    local _, head = reap_waiters(queue, alive, now)
    if head then notify(channel, head) end
  end
end
if now == nil or tonumber(expiry) > now then return 1 end
return 0
