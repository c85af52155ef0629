import type { BucketRequest } from '../token-bucket.js';
import type { Queued } from './coalescer.js';
import type { LuaScript } from './lua/lua-scripts.js';
import {
  appendScriptDecision,
  type DecisionExtra,
  decodeMany,
  groupDecisions,
  type ScriptCall,
  type ScriptResult,
  type TokenBucketMode,
} from './lua/script-codec.js';

/** A decision of a turn, as the store sends it. */
export type StoreDecisionCall = Pick<Queued, 'requests' | 'mode' | 'sent' | 'extra'>;

/** What `decideAll` needs of the store. */
export interface DecisionCalls {
  /** Why no call can be sent now (the connection is not ready); undefined when it can. */
  notReady(): Error | undefined;
  /** One script call. */
  evaluate(script: LuaScript, args: (string | number)[]): Promise<unknown>;
  /** A reply of `count` decisions came (the owned connection's liveness). */
  answered(count: number): void;
  /** One decision in a call of its own. */
  alone(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
    extra: DecisionExtra | undefined,
  ): Promise<ScriptResult>;
}

/**
 * `decisions`, in order: per decision its result, or the script's refusal of it. Decisions in a row of
 * one script share a call (`groupDecisions`), and the reservations of one bucket with the same numbers
 * in it are one batch (read and written once), in their order. Calls of one turn go out together, in
 * order, on the same connection: Redis runs them in that order.
 */
export function decideAll(
  calls: DecisionCalls,
  decisions: readonly StoreDecisionCall[],
  now: number | undefined,
): Promise<(ScriptResult | Error)[]> {
  // Without an offline queue ioredis would refuse the command anyway ("Stream isn't writeable"): say
  // where and why instead.
  const down = calls.notReady();
  if (down !== undefined) return Promise.reject(down);
  const grouped = groupDecisions(decisions);
  if (grouped.length === 1) return decideIn(calls, grouped[0], decisions, now);
  // A mixed turn (reservations beside takes, say): a call per run; a run of one decision goes as it would alone.
  const results = new Array<ScriptResult | Error>(decisions.length);
  const asError = (error: unknown) => (error instanceof Error ? error : new Error(String(error)));
  return Promise.all(
    grouped.map((call) => {
      if (call.owners.length === 1 && call.owners[0].length === 1) {
        const i = call.owners[0][0];
        const { requests, mode, sent, extra } = decisions[i];
        return calls.alone(requests, mode, now, sent, extra).then(
          (result) => void (results[i] = result),
          (error: unknown) => void (results[i] = asError(error)),
        );
      }
      return decideIn(calls, call, decisions, now).then(
        (answers) => call.owners.forEach((positions) => positions.forEach((i) => (results[i] = answers[i]))),
        (error: unknown) => call.owners.forEach((positions) => positions.forEach((i) => (results[i] = asError(error)))),
      );
    }),
  ).then(() => results);
}

/** One script call for the decisions of `call`; answers a result per decision of `decisions` (undefined where another call answers). */
function decideIn(
  calls: DecisionCalls,
  call: ScriptCall,
  decisions: readonly Pick<Queued, 'sent'>[],
  now: number | undefined,
): Promise<(ScriptResult | Error)[]> {
  const keys: string[] = [];
  const argv: (string | number)[] = [];
  for (const decision of call.decisions) appendScriptDecision(keys, argv, decision);
  if (now !== undefined) argv.push(now);
  let count = 0;
  for (const positions of call.owners) {
    for (const i of positions) {
      decisions[i].sent?.();
      count++;
    }
  }
  return calls.evaluate(call.script, [keys.length, ...keys, ...argv]).then((reply) => {
    calls.answered(count);
    const answers = decodeMany(reply, call.decisions);
    const results = new Array<ScriptResult | Error>(decisions.length);
    let j = 0;
    for (const positions of call.owners) for (const i of positions) results[i] = answers[j++];
    return results;
  });
}
