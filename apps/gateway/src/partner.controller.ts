import { Controller, Get, Res, ServiceUnavailableException } from '@nestjs/common';
import { RateLimitWaitTooLongError } from 'nest-redis-rate-limit';
import { PartnerClient } from './partner.client.js';

@Controller('api')
export class PartnerController {
  constructor(private readonly partner: PartnerClient) {}

  /**
   * Calls the partner API through PartnerClient, whose calls wait for their turn (5 per second for all
   * instances together). The request is not refused by a limit of its own: it waits for the partner's
   * pace, up to 3 s, else gets a 503 with Retry-After.
   */
  @Get('partner')
  async quote(@Res({ passthrough: true }) res: { header(name: string, value: string): unknown }) {
    try {
      return await this.partner.quote();
    } catch (error) {
      if (!(error instanceof RateLimitWaitTooLongError)) throw error;
      // Express and Fastify responses both have header().
      res.header('retry-after', String(error.retryAfterSeconds));
      throw new ServiceUnavailableException(`The partner API is busy: try again in ${error.retryAfterSeconds} s`);
    }
  }
}
