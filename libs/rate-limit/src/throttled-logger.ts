import { Logger } from '@nestjs/common';
import { FAILURE_LOG_INTERVAL_MS } from './rate-limit.constants.js';

/** A warning logged at most once per interval, with a count of what it held back. */
export class ThrottledLogger {
  private readonly logger: Logger;
  private last = 0;
  private held = 0;

  constructor(context: string, private readonly intervalMs = FAILURE_LOG_INTERVAL_MS) {
    this.logger = new Logger(context);
  }

  warn(message: string): void {
    const now = Date.now();
    if (now - this.last < this.intervalMs) {
      this.held++;
      return;
    }
    this.logger.warn(this.held > 0 ? `${message} (${this.held} more like it since the last warning)` : message);
    this.last = now;
    this.held = 0;
  }

  /** Lets the next warning through at once (after a recovery, say). */
  rearm(): void {
    this.last = 0;
    this.held = 0;
  }

  log(message: string): void {
    this.logger.log(message);
  }
}
