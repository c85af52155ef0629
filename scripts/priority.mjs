/**
 * Priorities of a process tree, for `npm test` (scripts/test.mjs): the package project runs niced beside
 * the timing project, and gets the normal priority back when that is done.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';

/** The process `pid` and every process below it (from `ps`), or only `pid` where `ps` cannot tell. */
export function processTree(pid) {
  let table;
  try {
    table = execFileSync('ps', ['-e', '-o', 'pid=,ppid='], { encoding: 'utf8' });
  } catch {
    return [pid];
  }
  const children = new Map();
  for (const line of table.split('\n')) {
    const [child, parent] = line.trim().split(/\s+/).map(Number);
    if (!Number.isInteger(child) || !Number.isInteger(parent)) continue;
    children.set(parent, [...(children.get(parent) ?? []), child]);
  }
  const tree = [];
  for (const queue = [pid]; queue.length > 0;) {
    const next = queue.shift();
    tree.push(next);
    queue.push(...(children.get(next) ?? []));
  }
  return tree;
}

/**
 * The threads of `pid` (/proc/<pid>/task), or only `pid` where the system does not list them. On Linux
 * a priority is a thread's: renice of a process reaches its main thread only, and the threads it has
 * already started (libuv's pool, V8's workers) would keep the old one.
 */
export function threadsOf(pid) {
  try {
    const threads = readdirSync(`/proc/${pid}/task`).map(Number).filter(Number.isInteger);
    return threads.length > 0 ? threads : [pid];
  } catch {
    return [pid];
  }
}

/**
 * Sets the niceness of `pid`, every process below it and every thread of them to `niceness`; what they
 * start from then on inherits it. False when the system refused (raising a priority needs root or a
 * RLIMIT_NICE that allows it); a process that ended meanwhile is no refusal.
 */
export function renice(pid, niceness) {
  const ids = processTree(pid).flatMap(threadsOf);
  const result = spawnSync('renice', ['-n', String(niceness), '-p', ...ids.map(String)], { encoding: 'utf8' });
  return result.error === undefined && !/permission denied|not permitted/i.test(result.stderr ?? '');
}
