import { Body, Controller, HttpCode, Post, UnauthorizedException } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** The demo's only password. */
const PASSWORD = 'open-sesame';

@Controller('auth')
export class AuthController {
  /**
   * Against password guessing: 5 failed attempts per IP, then one more every 3 minutes (5 per 15
   * minutes). A successful login gives its token back, so only failures count.
   */
  @Post('login')
  @HttpCode(200)
  @RateLimit({ capacity: 5, refillPerSecond: 5 / 900, keyBy: 'ip', refundOn: 'success' })
  login(@Body() body: { username?: string; password?: string }) {
    if (body?.password !== PASSWORD) throw new UnauthorizedException('Wrong username or password');
    return { ok: true, user: typeof body.username === 'string' ? body.username : 'anonymous' };
  }
}
