import { SetMetadata } from '@nestjs/common';
import { RATE_LIMIT_SKIP } from '../rate-limit.constants.js';

/** Exempts a controller or handler from rate limiting, module `defaults` included. */
export const SkipRateLimit = (skip = true) => SetMetadata(RATE_LIMIT_SKIP, skip);
