import type { ExecutionContext } from '@nestjs/common';
import { type CompiledPriority, floorOf, isPriorityLevel } from '../bucket/priority-option.js';
import type { PriorityLevel } from '../rate-limit.interfaces.js';
import { ThrottledLogger } from '../throttled-logger.js';

/**
 * A request's priority level and the floor it keeps in a bucket. A policy's priority function is the
 * app's code run on a client's request: whatever it does, the request is decided. An answer that is not
 * a level (a promise among them: the function is synchronous, so that nothing waits on it) or a throw
 * counts as `'default'`, with a warning at most once a minute per process: never an error, never a wait.
 */
export class PriorityLevels {
  private readonly logger = new ThrottledLogger('RateLimit');

  /** The tokens a request of `scope` at its level must leave in a bucket of `capacity`. */
  floorOf(priority: CompiledPriority, context: ExecutionContext, scope: string, capacity: number): number {
    return floorOf(priority, priority.level ?? this.levelOf(priority, context, scope), capacity);
  }

  private levelOf(priority: CompiledPriority, context: ExecutionContext, scope: string): PriorityLevel {
    let level: unknown;
    try {
      level = priority.of!(context);
    } catch (error) {
      this.logger.warn(
        `The priority function of ${scope} threw (${error instanceof Error ? error.message : 'a non-error'}): the request counts as 'default'`,
      );
      return 'default';
    }
    if (isPriorityLevel(level)) return level;
    if (typeof (level as { then?: unknown } | null)?.then === 'function') {
      // A rejected promise nobody awaits would be an unhandled rejection.
      (level as Promise<unknown>).then(undefined, () => undefined);
    }
    const shown = typeof level === 'string' ? JSON.stringify(level.slice(0, 40)) : typeof level;
    this.logger.warn(
      `The priority function of ${scope} answered ${shown}, not 'critical', 'default' or 'sheddable' (it must be synchronous): the request counts as 'default'`,
    );
    return 'default';
  }
}
