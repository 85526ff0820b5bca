-- Workflow bookkeeping: the helpers of the scripts that end a workflow's
-- child (settle.lua for successes and dead letters, dlq_discard.lua for
-- discards) and of those that start or grow one (flow_start.lua, flow_add.lua).
--
-- A batch is one hash, {chasqui:<q>}:flow:<batch id>, beside a list of its
-- children's job ids in the order given, <hash key>:kids. Every key of a
-- workflow carries its queue's hash tag, so on a cluster the script that
-- settles a child writes its batch in the same slot, atomically.
--
-- The hash holds: total (children added so far), ok, dead, gone (discarded),
-- k:<child id> (the child's end: ok, dead or gone), r:<child id> (its return
-- value, raw msgpack), ttl (ms the batch's keys are kept after each change),
-- stream (its queue's default stream: callbacks go there, or to their band's
-- stream), metrics (its queue's counters prefix), and per callback W (success
-- or complete): W:id (the callback's job id), W:payload (its envelope) or, for
-- a callback fed the batch's results, W:head, W:argc, W:args, W:mid, W:metan,
-- W:meta and W:feed ("one": the single child's result; "all": the list of
-- every child's result, in order); fired:W is set once W was enqueued.
--
-- flow_key(any, id)
--   The hash of batch `id` of the queue that owns key `any` (any key of it).
-- flow_of(payload)
--   The batch a job envelope belongs to (its meta "flow"), or false. Only an
--   envelope holding the bytes "flow" is unpacked.
-- flow_end(any, flow, child, outcome, result)
--   Record that child `child` of batch `flow` ended as `outcome` ("ok",
--   "dead" or "gone"), with its raw msgpack return value `result` ("" for
--   none); idempotent per child: a first success is final, a dead child may
--   later succeed (a replay) or be discarded, anything else is a repeat and
--   changes nothing. When the counts make a callback due it is enqueued here,
--   once (HSETNX fired:<callback>). Returns 1 when the end changed the batch.
-- flow_fire(key, which)
--   Enqueue callback `which` of the batch at `key` unless it fired before.
--   The first time, whether or not the batch has that callback, the batch's
--   end is counted in its queue's counters (batches_succeeded for success,
--   batches_completed for complete; callbacks for each callback or chain step
--   enqueued) and written to its queue's events stream (type batch_succeeded
--   or batch_completed, fields batch, job_id: the callback's, or empty, and
--   count: the batch's children).
-- flow_tally(key), flow_record(key, child, outcome, result, tally), flow_apply(tally)
--   flow_end in parts, so a settle call that ends many children of one batch
--   counts them with one HSETNX each and writes the counts, the results and
--   the check for due callbacks once per batch.
-- discard_flow_end(dlq, fields)
--   dlq_discard.lua's part: a discarded dead-letter entry (its fields, laid
--   flat) of a workflow's job ends it there as "gone".
-- settle_flow_ends(stream, acked, ends)
--   settle.lua's workflow section: `ends` is its flat array of (stream id,
--   batch id, job id, outcome, result); `acked` the stream ids the call
--   acknowledged one by one (the dead letters among them).

local function flow_key(any, id)
  return string.match(any, '^(%b{}:)') .. 'flow:' .. id
end

local function flow_of(payload)
  if not string.find(payload, 'flow', 1, true) then
    return false
  end
  local ok, envelope = pcall(cmsgpack.unpack, payload)
  if not ok or type(envelope) ~= 'table' or type(envelope[14]) ~= 'table' then
    return false
  end
  local flow = envelope[14]['flow']
  if type(flow) ~= 'string' or flow == '' then
    return false
  end
  return flow
end

local function flow_array_head(n)
  if n < 16 then
    return string.char(144 + n)
  elseif n < 65536 then
    return string.char(220, math.floor(n / 256), n % 256)
  end
  return string.char(221, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256,
    n % 256)
end

local function flow_map_head(n)
  if n < 16 then
    return string.char(128 + n)
  end
  return string.char(222, math.floor(n / 256), n % 256)
end

local function flow_results(key, feed)
  local kids = key .. ':kids'
  local n = redis.call('LLEN', kids)
  local parts = {}
  for s = 0, n - 1, 1000 do
    local ids = redis.call('LRANGE', kids, s, s + 999)
    local fields = {}
    for k = 1, #ids do
      fields[k] = 'r:' .. ids[k]
    end
    local values = redis.call('HMGET', key, unpack(fields))
    for k = 1, #ids do
      parts[#parts + 1] = values[k] or string.char(192)
    end
  end
  if feed == 'one' then
    return parts[1] or string.char(192)
  end
  return flow_array_head(#parts) .. table.concat(parts)
end

local function flow_fire(key, which)
  if redis.call('HSETNX', key, 'fired:' .. which, '1') == 0 then
    return
  end
  local h = redis.call('HMGET', key, which .. ':payload', which .. ':head', which .. ':argc', which .. ':args',
    which .. ':mid', which .. ':metan', which .. ':meta', which .. ':feed', 'stream', 'metrics', which .. ':id',
    'total')
  local now = server_ms()
  local ended = 'batch_completed'
  if which == 'success' then
    ended = 'batch_succeeded'
  end
  bump_counters(h[10], now, {ended == 'batch_succeeded' and 'batches_succeeded' or 'batches_completed', 1})
  redis.call('XADD', string.match(h[9], '^(%b{}:)') .. 'events', 'MAXLEN', '~', ${EVENTS_MAXLEN}, '*', 'type', ended,
    'batch', string.match(key, '^%b{}:flow:(.*)$$'), 'job_id', h[11] or '', 'count', h[12] or 0)
  local payload = h[1]
  if not payload then
    if not h[2] then
      return
    end
    payload = h[2] .. flow_array_head(tonumber(h[3])) .. h[4] .. h[5] .. flow_map_head(tonumber(h[6]) + 1)
      .. cmsgpack.pack('fed') .. flow_results(key, h[8]) .. h[7]
  end
  redis.call('XADD', band_stream(h[9], band_of(payload)), '*', 'j', payload)
  bump_counters(h[10], now, {'enqueued', 1, 'callbacks', 1})
end

local function flow_record(key, child, outcome, result, tally)
  local field = 'k:' .. child
  if redis.call('HSETNX', key, field, outcome) == 0 then
    if outcome == 'dead' or redis.call('HGET', key, field) ~= 'dead' then
      return
    end
    redis.call('HSET', key, field, outcome)
    tally.dead = tally.dead - 1
  end
  tally[outcome] = tally[outcome] + 1
  tally.changed = true
  if outcome == 'ok' and result ~= '' then
    tally.results[#tally.results + 1] = 'r:' .. child
    tally.results[#tally.results + 1] = result
  end
end

local function flow_tally(key)
  return {key = key, ok = 0, dead = 0, gone = 0, changed = false, results = {}}
end

local function flow_apply(tally)
  local key = tally.key
  if not tally.changed then
    return 0
  end
  if #tally.results > 0 then
    call_in_chunks('HSET', key, tally.results, 4000)
  end
  for _, name in ipairs({'ok', 'dead', 'gone'}) do
    if tally[name] ~= 0 then
      redis.call('HINCRBY', key, name, tally[name])
    end
  end
  local c = redis.call('HMGET', key, 'total', 'ok', 'dead', 'gone', 'ttl')
  local total, ok = tonumber(c[1]), tonumber(c[2]) or 0
  local ended = ok + (tonumber(c[3]) or 0) + (tonumber(c[4]) or 0)
  if ok == total then
    flow_fire(key, 'success')
  end
  if ended == total then
    flow_fire(key, 'complete')
    local ttl = tonumber(c[5])
    if ttl then
      redis.call('PEXPIRE', key, ttl)
      redis.call('PEXPIRE', key .. ':kids', ttl)
    end
  end
  return 1
end

local function flow_end(any, flow, child, outcome, result)
  local key = flow_key(any, flow)
  if redis.call('HEXISTS', key, 'total') == 0 then
    return 0
  end
  local tally = flow_tally(key)
  flow_record(key, child, outcome, result, tally)
  return flow_apply(tally)
end

local function settle_flow_ends(stream, acked, ends)
  local here
  local tallies, order = {}, {}
  for j = 1, #ends, 5 do
    local outcome = ends[j + 3]
    if outcome == 'dead' and not here then
      here = {}
      for k = 1, #acked do
        here[acked[k]] = true
      end
    end
    if outcome ~= 'dead' or here[ends[j]] then
      local flow = ends[j + 1]
      local tally = tallies[flow]
      if tally == nil then
        local key = flow_key(stream, flow)
        tally = false
        if redis.call('HEXISTS', key, 'total') == 1 then
          tally = flow_tally(key)
          order[#order + 1] = tally
        end
        tallies[flow] = tally
      end
      if tally then
        flow_record(tally.key, ends[j + 2], outcome, ends[j + 4], tally)
      end
    end
  end
  for k = 1, #order do
    flow_apply(order[k])
  end
end

local function discard_flow_end(dlq, fields)
  local payload, job_id
  for k = 1, #fields, 2 do
    if fields[k] == 'j' then
      payload = fields[k + 1]
    elseif fields[k] == 'job_id' then
      job_id = fields[k + 1]
    end
  end
  local flow = payload and flow_of(payload)
  if flow and job_id and job_id ~= '' then
    flow_end(dlq, flow, job_id, 'gone', '')
  end
end
