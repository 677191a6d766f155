-- queue_leave.lua: a waiter gives up (timeout, cancel); wake the next one if due.
--
-- KEYS[1]  holders  the lock's hash or the semaphore's zset of live leases.
-- KEYS[2]  queue    zset: waiting tokens scored by ticket.
-- KEYS[3]  alive    zset: waiting tokens scored by heartbeat deadline (server ms).
-- ARGV[1]  token    the waiter's token.
-- ARGV[2]  channel  wake-up channel.
-- ARGV[3]  rule     "lock": wake the new head only when the holders key is absent;
--                   "any": always wake it, and it re-checks for itself.
--
-- Returns 1 when the token was queued, 0 when it was not.

local holders, queue, alive = KEYS[1], KEYS[2], KEYS[3]
local token, channel, rule = ARGV[1], ARGV[2], ARGV[3]

local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == token
local removed = redis.call('ZREM', queue, token)
redis.call('ZREM', alive, token)
if was_head and not (rule == 'lock' and redis.call('EXISTS', holders) == 1) then
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then redis.call('PUBLISH', channel, head) end
end
return removed
