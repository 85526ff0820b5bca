-- Take a batch's limit slots, or park the jobs that must wait: one atomic call
-- per batch of limited jobs read from one queue.
--
-- A job runs only if every limit it falls under has room: the rate limits
-- (at most N starts in any window of W ms: a sorted set of start times) and the
-- concurrency limits (at most N running: a sorted set of entry ids scored by
-- when their slot lapses, so a dead worker's slots free themselves). Either it
-- takes a slot in each, or none. A job that must wait is acknowledged and goes
-- to the delayed set, its envelope untouched (no attempt is charged), due when
-- its limits allow: for a rate limit the moment its place in the window opens
-- (the k-th job waiting on a full window waits for the k-th oldest start to
-- leave it); for a concurrency limit the moment the oldest slot would lapse,
-- and earlier when a running job ends and limit_release.lua wakes it. For that
-- it is also written to the limit's parked set ("<stream id> <payload>").
-- Every job that waits is listed in its buckets' waiting sets (stream id, due
-- ms), and every bucket used in the queue's set of buckets: what the console
-- and /metrics count.
--
-- A rate limit is a promise about starts, and a job admitted here starts a
-- little later in its worker. So its worker must start it within the start
-- grace G (ARGV[7]) of this call, or take its token again first (a retake,
-- ARGV[8] = '1', with the late jobs' rate buckets only: each job's own token
-- is dropped, then it is checked like a new one and starts now or waits).
-- A token is scored by the latest moment its job may start (now + G) and
-- counts until a window W has passed since: then any W ms of starts holds at
-- most N, whatever grace each caller asked for (a worker behind a slow link
-- asks for more, so that its jobs can start before their tokens lapse).
--
-- KEYS[1] stream   KEYS[2] delayed   KEYS[3] the queue's set of limit buckets ({chasqui:<q>}:limits)
-- ARGV[1] consumer group
-- ARGV[2] prefix of the metrics counters ({chasqui:<q>}:m:), for `deferred`
-- ARGV[3] lifetime of a concurrency slot in ms (renewed by the holder's lease pass)
-- ARGV[4] msgpack array of 4 items per limit bucket laid flat: key prefix
--         ({chasqui:<q>}:limit:<scope>:<bucket>:), rate N (0: none), window ms,
--         concurrency N (0: none)
-- ARGV[5] msgpack array of 3 items per job laid flat, in the order read:
--         stream id, payload, array of the job's buckets (1-based positions in ARGV[4])
-- ARGV[6] what goes before a stream id in the limit sets' members: '' for the default
--         band's stream, '<band>:' for a priority band's (stream ids repeat across streams)
-- ARGV[7] start grace G, ms: the job must start within G of this call; its token is scored now + G
-- ARGV[8] '1' for a retake: the jobs' own rate tokens are dropped before they are checked
-- ARGV[9] the longest grace any worker asks for, ms: how long past its window a rate set may have to live
-- Returns {server ms, array of the admitted jobs' positions (1-based), number parked,
--          earliest due ms of a parked job or -1}
--
-- Calls server_ms, bump_counters and mark_delayed from prelude.lua.

local stream, delayed, known = KEYS[1], KEYS[2], KEYS[3]
local group, mprefix, lease, band = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[6] or ''
local grace = tonumber(ARGV[7] or '0') or 0
local longest = math.max(tonumber(ARGV[9] or '0') or 0, grace)
local buckets, jobs = cmsgpack.unpack(ARGV[4]), cmsgpack.unpack(ARGV[5])
local now = server_ms()

if ARGV[8] == '1' then  -- a retake: the late jobs' tokens are theirs to take again, not starts
  for j = 1, #jobs, 3 do
    for _, b in ipairs(jobs[j + 2]) do
      local base = (b - 1) * 4
      if tonumber(buckets[base + 2]) > 0 then
        redis.call('ZREM', buckets[base + 1] .. 'rate', band .. jobs[j])
      end
    end
  end
end

-- per bucket: starts in the window, running, and jobs parked on its rate so far in this call
local state = {}
local function look(b)
  local s = state[b]
  if s then return s end
  local base = (b - 1) * 4
  s = {prefix = buckets[base + 1], rate = tonumber(buckets[base + 2]),
       window = tonumber(buckets[base + 3]),
       conc = tonumber(buckets[base + 4]), started = 0, running = 0, waiting = 0}
  if s.rate > 0 then
    redis.call('ZREMRANGEBYSCORE', s.prefix .. 'rate', '-inf', now - s.window)
    s.started = redis.call('ZCARD', s.prefix .. 'rate')
  end
  if s.conc > 0 then
    redis.call('ZREMRANGEBYSCORE', s.prefix .. 'running', '-inf', now)
    s.running = redis.call('ZCARD', s.prefix .. 'running')
  end
  redis.call('SADD', known, s.prefix)
  state[b] = s
  return s
end

local admitted, parked, earliest = {}, 0, -1
for j = 1, #jobs, 3 do
  local id, payload, mine = jobs[j], jobs[j + 1], jobs[j + 2]
  local member = band .. id
  local due, full_rate, full_conc = now, {}, {}
  for _, b in ipairs(mine) do
    local s = look(b)
    if s.rate > 0 and s.started >= s.rate then
      -- the k-th job waiting on a full window starts when the k-th oldest token leaves it (a job due
      -- too early is only parked again: each take counts afresh)
      local k = s.waiting
      local oldest = redis.call('ZRANGE', s.prefix .. 'rate', k % s.rate, k % s.rate, 'WITHSCORES')
      local at = tonumber(oldest[2] or now) + s.window + (s.window + grace) * math.floor(k / s.rate)
      if at > due then due = at end
      full_rate[#full_rate + 1] = s
    end
    if s.conc > 0 and s.running >= s.conc then
      local first = redis.call('ZRANGE', s.prefix .. 'running', 0, 0, 'WITHSCORES')
      local at = tonumber(first[2] or now)
      if at > due then due = at end
      full_conc[#full_conc + 1] = s
    end
  end
  if #full_rate == 0 and #full_conc == 0 then
    for _, b in ipairs(mine) do
      local s = state[b]
      if s.rate > 0 then
        redis.call('ZADD', s.prefix .. 'rate', now + grace, member)
        redis.call('PEXPIRE', s.prefix .. 'rate', s.window + longest)  -- never cut short a longer grace's token
        s.started = s.started + 1
      end
      if s.conc > 0 then
        redis.call('ZADD', s.prefix .. 'running', now + lease, member)
        redis.call('PEXPIRE', s.prefix .. 'running', lease * 2)
        s.running = s.running + 1
      end
    end
    admitted[#admitted + 1] = (j + 2) / 3
  elseif redis.call('XACK', stream, group, id) == 1 then
    redis.call('XDEL', stream, id)
    redis.call('ZADD', delayed, due, payload)
    mark_delayed(delayed, payload, due, now)
    for _, s in ipairs(full_rate) do s.waiting = s.waiting + 1 end
    local keep = math.max(due - now, 0) + 60000
    for _, b in ipairs(mine) do
      local s = state[b]
      if (s.rate > 0 and s.started >= s.rate) or (s.conc > 0 and s.running >= s.conc) then
        local waiting = s.prefix .. 'waiting'
        redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
        redis.call('ZADD', waiting, due, member)
        redis.call('PEXPIRE', waiting, keep)
      end
    end
    for _, s in ipairs(full_conc) do
      local key = s.prefix .. 'parked'
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 60000)
      redis.call('ZADD', key, due, member .. ' ' .. payload)
      redis.call('PEXPIRE', key, keep)
    end
    parked = parked + 1
    if earliest < 0 or due < earliest then earliest = due end
  end
end
if parked > 0 then
  bump_counters(mprefix, now, {'deferred', parked})
end
return {now, admitted, parked, earliest}
