import { Logger } from '@nestjs/common';
import { FAILURE_LOG_INTERVAL_MS } from './rate-limit.constants.js';

type Level = 'warn' | 'log';

/**
 * Messages of each level logged at most once per interval, with a count of what was held back: a
 * failing store or a flapping one must not write a line per request.
 */
export class ThrottledLogger {
  private readonly logger: Logger;
  private readonly last: Record<Level, number> = { warn: -Infinity, log: -Infinity };
  private readonly held: Record<Level, number> = { warn: 0, log: 0 };

  constructor(
    context: string,
    private readonly intervalMs = FAILURE_LOG_INTERVAL_MS,
  ) {
    this.logger = new Logger(context);
  }

  warn(message: string): void {
    this.emit('warn', message);
  }

  log(message: string): void {
    this.emit('log', message);
  }

  /** Counts the next interval from now, as if a line of `level` had just been logged (by someone else, at another level). */
  hold(level: Level): void {
    this.last[level] = Date.now();
  }

  private emit(level: Level, message: string): void {
    const now = Date.now();
    if (now - this.last[level] < this.intervalMs) {
      this.held[level]++;
      return;
    }
    const held = this.held[level];
    this.logger[level](held > 0 ? `${message} (${held} more like it since the last one)` : message);
    this.last[level] = now;
    this.held[level] = 0;
  }
}
