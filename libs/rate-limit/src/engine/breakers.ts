import { PROBE_AFTER_FAILURES } from '../rate-limit.constants.js';
import type { FailureMode } from '../rate-limit.options.js';
import type { BucketStore } from '../stores/bucket-store.interface.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import type { ThrottledLogger } from '../throttled-logger.js';
import type { Fallback } from './fallback.js';

/** The breaker of one Redis node: calls that failed in a row, and whether a probe is on its way. */
export interface Breaker {
  failures: number;
  probing: boolean;
}

const SINGLE_NODE: readonly string[] = [''];

/**
 * One breaker per Redis node ('' for a single server, or a Cluster node whose slots are not known yet),
 * present only while that node's last calls failed: a hung shard trips its own, the others keep deciding.
 */
export class Breakers {
  /** The nodes whose last calls failed; empty while the store is healthy. */
  readonly open = new Map<string, Breaker>();
  /** What the last failure said (for the health status). */
  lastError: string | undefined;

  constructor(
    private readonly store: BucketStore,
    private readonly failureMode: FailureMode,
    private readonly fallback: Fallback,
    private readonly logger: ThrottledLogger,
  ) {}

  /** True while a node keeps failing: one decision at a time probes it, the others follow `failureMode`. */
  get failing(): boolean {
    for (const breaker of this.open.values()) if (breaker.failures >= PROBE_AFTER_FAILURES) return true;
    return false;
  }

  /**
   * The breakers of a decision's nodes: one open and probed already sends it to failureMode (answers
   * 'fallback'), one open and not probed makes it the probe (answered, to be released when it settles).
   */
  probesFor(requests: readonly BucketRequest[]): Breaker[] | undefined | 'fallback' {
    let probes: Breaker[] | undefined;
    for (const node of this.nodesOf(requests)) {
      const breaker = this.open.get(node);
      if (breaker === undefined || breaker.failures < PROBE_AFTER_FAILURES) continue;
      if (breaker.probing) {
        probes?.forEach((probe) => (probe.probing = false));
        return 'fallback';
      }
      breaker.probing = true;
      (probes ??= []).push(breaker);
    }
    return probes;
  }

  /** The Redis nodes that hold `requests`' buckets: one for a single server (''), one per slot owner on a Cluster. */
  private nodesOf(requests: readonly BucketRequest[]): readonly string[] {
    const nodeOf = this.store.nodeOf;
    if (nodeOf === undefined) return SINGLE_NODE;
    if (requests.length === 1) return [nodeOf.call(this.store, requests[0].key) ?? ''];
    return [...new Set(requests.map((request) => nodeOf.call(this.store, request.key) ?? ''))];
  }

  /** A failed call counts against the breaker of every node it asked: it cannot tell which one failed. */
  failed(error: unknown, requests: readonly BucketRequest[]): void {
    const nodes = this.nodesOf(requests);
    for (const node of nodes) {
      const breaker = this.open.get(node);
      if (breaker === undefined) this.open.set(node, { failures: 1, probing: false });
      else breaker.failures++;
    }
    this.lastError = error instanceof Error ? error.message : String(error);
    this.logger.warn(
      `Rate-limit store failed${describeNodes(nodes)}: ${this.lastError}; ` +
        `${this.fallback.effect} until it answers again (failureMode '${this.failureMode}')`,
    );
  }

  /** The nodes of a call that succeeded answer again: their breakers close. */
  recovered(requests: readonly BucketRequest[]): void {
    // On a Cluster, failures counted before its slots were known ('') are over too.
    const asked = this.store.nodeOf === undefined ? this.nodesOf(requests) : [...this.nodesOf(requests), ''];
    const nodes = asked.filter((node) => this.open.delete(node));
    if (nodes.length === 0) return;
    if (this.open.size > 0) {
      this.logger.log(`Rate-limit store answers again${describeNodes(nodes)}; other nodes still fail`);
      return;
    }
    const degraded = this.fallback.recovered();
    this.logger.log(
      `Rate-limit store answers again${describeNodes(nodes)}; ${degraded} decision(s) followed failureMode '${this.failureMode}' meanwhile`,
    );
  }
}

/** ' (Redis node host:port, …)' for Cluster nodes; nothing for a single server. */
function describeNodes(nodes: readonly string[]): string {
  const named = nodes.filter((node) => node !== '');
  return named.length === 0 ? '' : ` (Redis node ${named.join(', ')})`;
}
