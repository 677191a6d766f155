-- queue_leave.lua: a waiter gives up (timeout, cancel); wake the next one if due.
--
-- KEYS[1]  holders  the lock's hash or the semaphore's zset of live leases.
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- ARGV[1]  token    the waiter's token.
-- ARGV[2]  channel  wake-up channel; a token ending in ".<tag>" is told on
--                   `channel:<tag>` (its process's own channel) instead.
-- ARGV[3]  rule     "lock": wake the new head only when the holders key is absent;
--                   "any": always wake it, and it re-checks for itself;
--                   "semaphore": KEYS[1] is a zset scored by expiry (server ms); if
--                   the token was among the first `ARGV[4] - live leases` waiters
--                   (those allowed a permit; only the head if ARGV[5] is "1"), wake
--                   the one that takes its place, on `channel:<tag>` when its token
--                   ends in ".<tag>" (see lib_semaphore.lua).
-- ARGV[4]  limit    with rule "semaphore": the semaphore's limit (integer >= 1).
-- ARGV[5]  fair     with rule "semaphore": "1" when only the head may take a permit.
--
-- Returns 1 when the token was queued, 0 when it was not.

local holders, queue, alive = KEYS[1], KEYS[2], KEYS[3]
local token, channel, rule = ARGV[1], ARGV[2], ARGV[3]

local rank = redis.call('ZRANK', queue, token)
local removed = redis.call('ZREM', queue, token)
redis.call('ZREM', alive, token)
if rule == 'semaphore' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local live = redis.call('ZCOUNT', holders, string.format('(%d', now), '+inf')
  local free = tonumber(ARGV[4]) - live
  if ARGV[5] == '1' and free > 1 then free = 1 end
  local next = rank and rank < free and redis.call('ZRANGE', queue, free - 1, free - 1)[1]
  local tag = next and string.match(next, '%.(%w+)$')
  if tag then channel = channel .. ':' .. tag end
  if next then redis.call('PUBLISH', channel, next) end
elseif rank == 0 and not (rule == 'lock' and redis.call('EXISTS', holders) == 1) then
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  local tag = head and string.match(head, '%.(%w+)$')
  if tag then channel = channel .. ':' .. tag end
  if head then redis.call('PUBLISH', channel, head) end
end
return removed
