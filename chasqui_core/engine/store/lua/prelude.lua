-- The prelude: helpers every script of this folder may call.
--
-- scripts.py puts this file in front of each script when it loads them, once
-- per process, squeezed onto the script's first line: comment lines are
-- dropped and the code lines joined with spaces. So a script's line numbers
-- in Lua error messages are those of its own file, and an error inside a
-- helper below reports line 1. Because of the squeeze, a comment here must be
-- on a line of its own, never after code.
--
-- The placeholders below (a dollar sign and a name in braces) are filled in
-- at load from Python, where each is defined once: the counter buckets' key
-- parts (keys.py) and lifetimes in seconds (metrics.py).
--
-- server_ms()
--   The server's clock in epoch milliseconds: the clock of every delayed-set
--   score and counter bucket, whoever's clock the caller has.
-- call_in_chunks(command, key, items, size)
--   redis.call(command, key, ...) with the flat list `items` in slices of at
--   most `size` (keep it even for lists of pairs), since Lua's unpack has a
--   stack limit; with key nil, the items alone (UNLINK). Returns the sum of
--   the replies (XACK's count); calls nothing for an empty list.
-- bump_counters(mprefix, now, counts)
--   Add to the queue's per-second and per-minute counters at server time
--   `now` (ms). mprefix is the queue's counters prefix ({chasqui:<q>}:m:);
--   counts is a flat list of field name, amount pairs; amounts of 0 are
--   skipped. A bucket gets its expiry when a counter is created in it, not
--   on every bump: one command fewer per bucket on the busy path. The same
--   amounts go to the queue's all-time counters (<mprefix>total, never
--   expiring), in the same atomic call, so the two never disagree.
-- durations_key(mprefix)
--   The key of the queue's run-duration histograms (see engine/ops/totals.py).
-- totals_key(mprefix)
--   The key of the queue's all-time counters.
-- band_of(payload)
--   The priority band a job envelope's priority (its meta "priority") puts it
--   in: 'high' above 0, 'low' below 0, '' (the default band) otherwise. Only
--   an envelope holding the bytes "priority" is unpacked, so a job of the
--   default priority costs one substring search.
-- band_stream(stream, band)
--   Where a job of that band goes: `stream` ({chasqui:<q>}:stream) itself for
--   the default band, else <stream>:<band>. A band's stream is made, with the
--   workers' consumer group, when the first job goes to it, and the band is
--   added to the queue's set of bands ({chasqui:<q>}:bands, beside the
--   stream), which tells the workers to read it.
-- mark_delayed(delayed, payload, at, now)
--   Call with every ZADD of `payload` to the delayed set `delayed` at score
--   `at` (server time `now`): notes `at` under the job's mark,
--   {chasqui:<q>}:djob:<job id> (keys.py), so lookup.py finds the job
--   without scanning the set. The mark expires a grace after `at`. The id
--   is read from the envelope's head (a msgpack array: its length, the
--   version, then the id as a string): a few bytes, not a decode. A payload
--   of another layout gets no mark (lookup.py then scans the set). A
--   script calls it for one queue's delayed set only: the marks' key
--   prefix is worked out once per call.

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function call_in_chunks(command, key, items, size)
  local total = 0
  for s = 1, #items, size do
    local e = math.min(s + size - 1, #items)
    local reply
    if key then
      reply = redis.call(command, key, unpack(items, s, e))
    else
      reply = redis.call(command, unpack(items, s, e))
    end
    if type(reply) == 'number' then total = total + reply end
  end
  return total
end

local function bump_counters(mprefix, now, counts)
  local sec = math.floor(now / 1000)
  local skey = mprefix .. '${SECOND_BUCKET}' .. sec
  local mkey = mprefix .. '${MINUTE_BUCKET}' .. math.floor(sec / 60)
  local tkey = mprefix .. '${TOTALS}'
  for k = 1, #counts, 2 do
    local field, n = counts[k], counts[k + 1]
    if n > 0 then
      if redis.call('HINCRBY', skey, field, n) == n then
        redis.call('EXPIRE', skey, ${SECOND_BUCKET_TTL})
      end
      if redis.call('HINCRBY', mkey, field, n) == n then
        redis.call('EXPIRE', mkey, ${MINUTE_BUCKET_TTL})
      end
      redis.call('HINCRBY', tkey, field, n)
    end
  end
end

local function durations_key(mprefix)
  return mprefix .. '${DURATIONS}'
end

local function totals_key(mprefix)
  return mprefix .. '${TOTALS}'
end

local function band_of(payload)
  if not string.find(payload, 'priority', 1, true) then
    return ''
  end
  local ok, envelope = pcall(cmsgpack.unpack, payload)
  if not ok or type(envelope) ~= 'table' or type(envelope[14]) ~= 'table' then
    return ''
  end
  local priority = tonumber(envelope[14]['priority'])
  if priority == nil or priority == 0 then
    return ''
  elseif priority > 0 then
    return 'high'
  end
  return 'low'
end

local function band_stream(stream, band)
  if band == '' then
    return stream
  end
  local key = stream .. ':' .. band
  if redis.call('EXISTS', key) == 0 then
    redis.pcall('XGROUP', 'CREATE', key, '${GROUP}', '0', 'MKSTREAM')
    redis.call('SADD', string.sub(stream, 1, -7) .. 'bands', band)
  end
  return key
end

local mark_prefix
local function mark_delayed(delayed, payload, at, now)
  local head, version, kind = string.byte(payload, 1, 3)
  if head ~= ${ENVELOPE_HEAD} or version ~= ${ENVELOPE_VERSION} or not kind then return end
  local id
  if kind >= 160 and kind <= 191 then
    id = string.sub(payload, 4, 3 + kind - 160)
  elseif kind == 217 then
    id = string.sub(payload, 5, 4 + string.byte(payload, 4))
  else
    return
  end
  mark_prefix = mark_prefix or string.sub(delayed, 1, #delayed - ${DELAYED_LEN}) .. '${DELAYED_MARK}'
  redis.call('SET', mark_prefix .. id, at, 'PX', math.floor(math.max(at - now, 0)) + ${DELAYED_MARK_GRACE_MS})
end
