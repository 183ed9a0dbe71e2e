// The coordinator's status page: renders the job list (with the queue and
// the users) or one job's page
// from the JSON embedded in the page (so it is whole on load), then
// refreshes it from /api/jobs[/ID] every 2 s. Charts use uPlot
// (third_party/uplot), served from the coordinator like this file.
(function () {
  'use strict';
  var REFRESH_MS = 2000;
  var body = document.body;
  var main = document.getElementById('main');
  var charts = {};

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) {
      e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return e;
  }
  function num(v) { return v === undefined || v === null ? 0 : Number(v); }
  function fixed(v, d) { return num(v).toFixed(d); }
  function duration(s) {
    s = num(s);
    if (s < 0) return '';
    if (s < 90) return s.toFixed(0) + ' s';
    if (s < 5400) return (s / 60).toFixed(0) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  function table(headers, rows) {
    var head = el('tr', {}, headers.map(function (h) {
      return el('th', { 'class': h[1] || '' }, [h[0]]);
    }));
    return el('table', {}, [el('thead', {}, [head]), el('tbody', {}, rows)]);
  }
  function td(text, cls) { return el('td', cls ? { 'class': cls } : {}, [String(text)]); }

  function renderJobs(data) {
    document.getElementById('title').textContent = 'jobs';
    var rows = (data.jobs || []).map(function (j) {
      var link = el('a', { href: '/jobs/' + encodeURIComponent(j.job_id) }, [j.job_id]);
      var id = el('td', { 'class': 'text' }, [link]);
      return el('tr', { 'data-job': j.job_id }, [
        id, td(j.name, 'text'), td(j.owner || '', 'text'), td(j.state, 'text state-' + j.state),
        td(j.world_size),
        td(j.step), td(j.progress >= 0 ? (100 * j.progress).toFixed(1) + ' %' : ''),
        td(duration(j.eta_seconds)), td(duration(j.age_seconds)), td(fixed(j.samples_per_second, 1)),
        td(j.diagnoses ? j.diagnoses : ''), td(j.reason, 'text')]);
    });
    main.replaceChildren(el('h2', {}, ['Jobs']), table(
      [['job', 'text'], ['name', 'text'], ['owner', 'text'], ['state', 'text'], ['ranks'], ['step'],
       ['progress'],
       ['ETA'], ['age'], ['samples/s'], ['problems'], ['reason', 'text']], rows),
      el('h2', {}, ['Queue']), queueTable(data.queue || []),
      el('h2', {}, ['Users']), usersTable(data.users || []));
  }

  // Queued jobs in the order they will be placed, each with why it waits.
  function queueTable(queue) {
    if (!queue.length) return el('p', { id: 'queue', 'class': 'empty' }, ['No job is waiting.']);
    var rows = queue.map(function (q) {
      var link = el('a', { href: '/jobs/' + encodeURIComponent(q.job_id) }, [q.job_id]);
      return el('tr', { 'data-queued': q.job_id }, [
        td(q.position), el('td', { 'class': 'text' }, [link]), td(q.owner || 'anonymous', 'text'),
        td(q.priority, 'text'), td(q.min_ranks + ' ' + q.device, 'text'),
        td(q.holds_reservation ? q.device + ' reservation' : '', 'text'), td(q.reason, 'text')]);
    });
    var t = table([['#'], ['job', 'text'], ['owner', 'text'], ['priority', 'text'],
                   ['min ranks', 'text'], ['holds', 'text'], ['reason', 'text']], rows);
    t.id = 'queue';
    return t;
  }

  // Each user's slots in use, jobs and decayed fair-share usage.
  function usersTable(users) {
    if (!users.length) return el('p', { id: 'users', 'class': 'empty' }, ['No user has jobs.']);
    var rows = users.map(function (u) {
      var slots = Object.keys(u.slots || {}).map(function (d) { return u.slots[d] + ' ' + d; });
      return el('tr', { 'data-user': u.user }, [
        td(u.user || 'anonymous', 'text'), td(slots.join(', ') || '0', 'text'),
        td(u.running_jobs), td(u.queued_jobs), td(fixed(u.fair_share_slot_seconds, 0))]);
    });
    var t = table([['user', 'text'], ['slots in use', 'text'], ['running'], ['queued'],
                   ['fair-share usage (slot-s)']], rows);
    t.id = 'users';
    return t;
  }

  function chart(id, title, xs, series) {
    var holder = document.getElementById(id);
    var data = [xs].concat(series.map(function (s) { return s.values; }));
    if (charts[id]) { charts[id].setData(data); return; }
    var opts = {
      title: title, width: 520, height: 240,
      scales: { x: { time: false } },
      series: [{ label: 'step' }].concat(series.map(function (s) {
        return { label: s.label, stroke: s.color, width: 2 };
      })),
      axes: [{ label: 'step' }, { size: 64 }]
    };
    charts[id] = new uPlot(opts, data, holder);
  }

  function renderJob(data) {
    var st = data.status || {};
    var job = st.job || {};
    var jobId = body.getAttribute('data-job');
    document.getElementById('title').textContent = jobId + ' ' + ((job.spec || {}).name || '');
    var culprits = {};
    (st.diagnoses || []).forEach(function (d) {
      (d.ranks || []).forEach(function (r) {
        culprits[r] = (culprits[r] ? culprits[r] + '; ' : '') + d.kind + ' ' + d.message;
      });
    });
    var rows = (st.ranks || []).map(function (r) {
      var rank = num(r.rank);
      var diagnosed = culprits[rank] !== undefined;
      var cells = [td(rank), td(r.host || '', 'text'), td(r.state || '', 'text'), td(num(r.step)),
        td(r.phase || '', 'text'), td(fixed(r.phase_seconds, 1) + ' s'),
        td(fixed(r.heartbeat_age_seconds, 1) + ' s'), td(fixed(r.compute_seconds, 3)),
        td(fixed(r.comm_wait_seconds, 3)), td(fixed(r.caused_wait_seconds, 3)),
        td(fixed(r.samples_per_second, 1)), el('td', { 'class': 'diagnosis' },
          [diagnosed ? culprits[rank] : ''])];
      var attrs = { 'data-rank': String(rank) };
      if (diagnosed) attrs['class'] = 'diagnosed';
      return el('tr', attrs, cells);
    });
    var summary = el('p', { 'class': 'summary' }, [
      el('span', { 'class': 'state-' + job.state }, ['state ' + (job.state || '')]),
      el('span', {}, [job.owner ? 'owner ' + job.owner : '']),
      el('span', {}, ['generation ' + num(job.generation)]),
      el('span', {}, ['ranks ' + num(job.world_size)]),
      el('span', {}, [job.reason ? 'reason: ' + job.reason : ''])]);
    // Rows of a page of ranks (and of the ranks a diagnosis names): say
    // which, summarize them all, and link the neighbouring pages.
    var all = st.rank_summary || {};
    var paged = el('p', { 'class': 'paged' }, []);
    if (num(all.ranks) > rows.length) {
      var first = num(st.rank_offset), shown = rows.length;
      var states = Object.keys(all.by_state || {}).map(function (k) {
        return num(all.by_state[k]) + ' ' + k;
      }).join(', ');
      var link = function (offset, text) {
        return el('a', { href: '?rank_offset=' + Math.max(0, offset) }, [text]);
      };
      var parts = ['ranks from ' + first + ' (' + shown + ' rows) of ' + num(all.ranks) +
                   ': ' + states + '; steps ' + num(all.min_step) + '..' + num(all.max_step) + ' '];
      if (first > 0) parts.push(link(first - 1024, 'previous'), ' ');
      if (first + 1024 < num(all.ranks)) parts.push(link(first + 1024, 'next'));
      paged = el('p', { 'class': 'paged' }, parts);
    }
    var diagList = el('ul', { 'class': 'diag-list' }, (st.diagnoses || []).map(function (d) {
      return el('li', {}, [d.kind + ' ' + d.message]);
    }));
    var history = data.history || [];
    var events = el('table', {}, (data.events || []).slice().reverse().map(function (e) {
      return el('tr', {}, [td(new Date(e.time_s * 1000).toLocaleTimeString(), 'text'),
                           td(e.text, 'text')]);
    }));
    var ckpts = el('table', {}, (data.checkpoints || []).map(function (c) {
      return el('tr', {}, [td('step ' + c.step, 'text'), td((c.bytes / 1048576).toFixed(2) + ' MiB'),
                           td(new Date(c.time_s * 1000).toLocaleTimeString(), 'text')]);
    }));
    var logs = el('pre', { 'class': 'logs' }, [(data.logs || []).map(function (l) {
      return '[rank ' + l.rank + '] ' + l.text;
    }).join('\n')]);
    if (!main.firstChild) {
      main.appendChild(el('div', { id: 'summary' }));
      main.appendChild(el('h2', {}, ['Ranks']));
      main.appendChild(el('div', { id: 'ranks' }));
      main.appendChild(el('div', { id: 'diagnoses' }));
      main.appendChild(el('h2', {}, ['Training']));
      main.appendChild(el('div', { 'class': 'charts' }, [
        el('div', { id: 'loss-chart', 'class': 'chart' }),
        el('div', { id: 'throughput-chart', 'class': 'chart' })]));
      main.appendChild(el('h2', {}, ['Events (states, generations, diagnoses)']));
      main.appendChild(el('div', { id: 'events' }));
      main.appendChild(el('h2', {}, ['Checkpoints']));
      main.appendChild(el('div', { id: 'checkpoints' }));
      main.appendChild(el('h2', {}, ['Last log lines']));
      main.appendChild(el('div', { id: 'logs' }));
    }
    document.getElementById('summary').replaceChildren(summary, paged);
    document.getElementById('ranks').replaceChildren(table(
      [['rank'], ['host', 'text'], ['state', 'text'], ['step'], ['phase', 'text'], ['in phase'],
       ['heartbeat age'], ['compute s/step'], ['wait s/step'], ['others waited s/step'],
       ['samples/s'], ['diagnosis', 'text']], rows));
    document.getElementById('diagnoses').replaceChildren(diagList);
    document.getElementById('events').replaceChildren(events);
    document.getElementById('checkpoints').replaceChildren(ckpts);
    document.getElementById('logs').replaceChildren(logs);
    var xs = history.map(function (h) { return num(h.step); });
    chart('loss-chart', 'loss / eval accuracy', xs, [
      { label: 'loss', color: '#c20', values: history.map(function (h) { return num(h.loss); }) },
      { label: 'eval accuracy', color: '#06a',
        values: history.map(function (h) { return h.eval_accuracy > 0 ? num(h.eval_accuracy) : null; }) }]);
    chart('throughput-chart', 'samples / s', xs, [
      { label: 'samples/s', color: '#0a6',
        values: history.map(function (h) { return num(h.samples_per_second); }) }]);
  }

  var kind = body.getAttribute('data-page');
  var render = kind === 'job' ? renderJob : renderJobs;
  // A large job's rank rows come in pages: the page's own query
  // (?rank_offset=N&rank_limit=M) picks the same rows on every refresh.
  var url = kind === 'job' ? '/api/jobs/' + encodeURIComponent(body.getAttribute('data-job')) +
                             window.location.search
                           : '/api/jobs';
  render(JSON.parse(document.getElementById('initial').textContent));
  function refresh() {
    fetch(url, { cache: 'no-store' }).then(function (r) {
      if (!r.ok) throw new Error('HTTP ' + r.status);
      return r.json();
    }).then(function (data) {
      render(data);
      document.getElementById('refreshed').textContent =
          'updated ' + new Date().toLocaleTimeString();
    }).catch(function (e) {
      document.getElementById('refreshed').textContent = 'refresh failed: ' + e.message;
    }).then(function () { setTimeout(refresh, REFRESH_MS); });
  }
  setTimeout(refresh, REFRESH_MS);
})();
