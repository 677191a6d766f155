-- semaphore_info.lua: read a semaphore's state without changing anything.
--
-- KEYS[1]  holders  zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases   hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  queue    zset: waiting tokens scored by ticket.
-- KEYS[4]  meta     hash: "limit", the limit the latest acquire enforced.
-- KEYS[5]  alive    optional: zset of waiters by heartbeat deadline; when given,
--                   only waiters whose heartbeat has not lapsed are counted.
-- ARGV[1]  nonce    a fresh random string per call (stamps the reply).
--
-- Returns {stamp, reply}: stamp is 'I' and the first 8 characters of ARGV[1]
-- (see LuaScript in scripts.py: a reply is never taken for another call's).
-- reply is {now_ms, {token, expiry_ms, fence, owner, granted_ms, ...} for each live
-- lease (expired ones are skipped), number of waiters, stored limit or ""}.

local STAMP = 'I' .. string.sub(ARGV[1], 1, 8)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf',
  'WITHSCORES')
local rows = {}
for i = 1, #live, 2 do
  local token = live[i]
  local details = redis.call('HMGET', KEYS[2], 'f:' .. token, 'o:' .. token, 's:' .. token)
  rows[#rows + 1] = token
  rows[#rows + 1] = live[i + 1]
  rows[#rows + 1] = details[1] or ''
  rows[#rows + 1] = details[2] or ''
  rows[#rows + 1] = details[3] or ''
end
local waiters
if KEYS[5] then
  waiters = redis.call('ZCOUNT', KEYS[5], string.format('(%d', now), '+inf')
else
  waiters = redis.call('ZCARD', KEYS[3])
end
return {STAMP, {now, rows, waiters,
  redis.call('HGET', KEYS[4], 'limit') or ''}}
