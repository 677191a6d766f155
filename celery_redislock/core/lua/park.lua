-- park.lua: park a run refused a permit at the tail of its pool's FIFO queue; if a
-- permit is free meanwhile (a lapsed lease, a raised limit), claim the queue's head
-- entries for it at once (see lib_parking.lua for the entry states).
--
-- KEYS[1]  holders   zset: live leases' tokens scored by expiry (server ms).
-- KEYS[2]  leases    hash: fence, owner and grant time of each lease in holders.
-- KEYS[3]  fence     string: last fence granted.
-- KEYS[4]  meta      hash: "limit", the limit the latest acquire enforced; "reserve",
--                    the latest park's ARGV[5] (what releases and sweeps reserve).
-- KEYS[5]  queue     zset: runs waiting in place (semaphore waiters), read only.
-- KEYS[6]  parked    zset: parked entry ids scored by ticket (server µs).
-- KEYS[7]  payloads  hash: "p:<id>" payload, "o:<id>" owner, "t:<id>" ticket.
-- KEYS[8]  claimed   zset: claimed entry ids scored by reservation expiry (ms).
-- KEYS[9]  taken     zset: consumed ids (see park_take.lua), read only.
-- KEYS[10] done      string "<prefix>:semaphore:{name}:done:<id>": the ids this park
--                    claimed, kept RELEASE_MEMORY_MS, so a re-sent park (its reply
--                    lost) answers as the first did.
-- ARGV[1]  id        the new entry's id (its park token: random, or derived from
--                    the message so that a redelivered copy re-sends a known id).
-- ARGV[2]  payload   opaque bytes: what to publish when the entry is claimed.
-- ARGV[3]  owner     owner id of the reserved permit (e.g. the task id).
-- ARGV[4]  limit     the caller's limit (integer >= 1): obeyed, and stored in meta
--                    for the releases and the sweepers, as an acquire stores it.
-- ARGV[5]  reserve   milliseconds a claimed entry's permit is reserved for it.
-- ARGV[6]  keep      milliseconds the parking keys outlive the latest park.
-- ARGV[7]  standby   optional, default 0: runs to keep waiting in place ahead of the
--                    next release (see claim_standbys in lib_parking.lua).
-- ARGV[8]  intake    optional, default "0"; "1": park only when the run would be
--                    refused -- runs are parked already, or no permit is free for it
--                    -- else change nothing and answer {-1} (the caller lets the run
--                    start and take a permit as usual).
-- ARGV[9]  sent      optional: when the run was sent, µs since the epoch (the
--                    sender's clock); its ticket then orders it by sending, not by
--                    parking, clamped to [now - SENT_WINDOW_US, now]. Empty: now.
-- ARGV[10] grace     optional: the restart grace, ms (see restart_grace in
--                    lib_restart.lua): within it, permits not taken back yet by their
--                    holders from before a data loss are held for them.
-- Constants (see lib_lock.lua, lib_parking.lua): FENCE_MEMORY_MS, RELEASE_MEMORY_MS,
-- SENT_WINDOW_US.
--
-- Returns {stamp, reply} (stamp: 'pk' and the first 8 characters of ARGV[1]); reply
-- is {position, id, payload, ...}: the entry's 1-based place in the queue (0
-- when it was claimed at once), then {id, payload, owner} of each entry claimed, to
-- be published by the caller. When `id` is known already (parked, claimed or taken:
-- a re-sent park, which must never queue a run that started) nothing changes and the
-- reply is its place now (0 once claimed or taken), with the entries the first park
-- claimed that are still claimed.

--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua

local STAMP = 'pk' .. string.sub(ARGV[1], 1, 8)
local k = parking_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8])
local id, payload, owner = ARGV[1], ARGV[2], ARGV[3]
local reserve, keep = tonumber(ARGV[5]), tonumber(ARGV[6])
local limit = tonumber(ARGV[4])
local now, now_us = server_clock()

if redis.call('HEXISTS', k.payloads, 'p:' .. id) == 1 or redis.call('ZSCORE', KEYS[9], id) then
  local place = redis.call('ZRANK', k.parked, id)
  local reply, done = {place and place + 1 or 0}, redis.call('GET', KEYS[10]) or ''
  return {STAMP, append_still_claimed(reply, done, k.payloads, k.claimed)}
end
local grace = tonumber(ARGV[10])
if grace then
--!include lib_restart.lua
  local left, marker = restart_grace(k.holders, grace, now_us)
  if left > 0 then hold_for_restart(k.holders, k.leases, limit, left, now, marker) end
end
--!include lib_lock.lua
--!include lib_semaphore.lua
--!include lib_parking.lua
unclaim_lapsed(k, now)
if ARGV[8] == '1' and redis.call('EXISTS', k.parked) == 0
    and free_for_parked(k, KEYS[5], limit, now) > 0 then
  return {STAMP, {-1}}
end
local ticket = tonumber(ARGV[9] or '')
if ticket then
  ticket = math.max(math.min(ticket, now_us), now_us - {{SENT_WINDOW_US}})
else
  local tail = redis.call('ZRANGE', k.parked, -1, -1, 'WITHSCORES')
  ticket = now_us
  if tail[2] and tonumber(tail[2]) >= ticket then ticket = tonumber(tail[2]) + 1 end
end
ticket = string.format('%d', ticket)
redis.call('ZADD', k.parked, ticket, id)
redis.call('HSET', k.payloads, 'p:' .. id, payload, 'o:' .. id, owner, 't:' .. id, ticket)
for _, key in ipairs({k.parked, k.payloads}) do redis.call('PEXPIRE', key, keep) end

redis.call('HSET', k.meta, 'limit', ARGV[4], 'reserve', ARGV[5])
redis.call('PEXPIRE', k.meta, {{FENCE_MEMORY_MS}})
local claimed = claim_heads(k, free_for_parked(k, KEYS[5], limit, now), now, now_us, reserve)
local ahead = claim_standbys(k, KEYS[5], tonumber(ARGV[7] or '0'), now, reserve)
local position = redis.call('ZRANK', k.parked, id)
local reply = {0}
if position then reply[1] = position + 1 end
for _, v in ipairs(claimed) do reply[#reply + 1] = v end
for _, v in ipairs(ahead) do reply[#reply + 1] = v end
if #reply > 1 then
  local ids = {}
  for i = 2, #reply, 3 do ids[#ids + 1] = reply[i] end
  redis.call('SET', KEYS[10], table.concat(ids, ' '), 'PX', {{RELEASE_MEMORY_MS}})
end
return {STAMP, reply}
