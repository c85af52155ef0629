import { Controller, Get, HttpCode, Post, Req, UseGuards } from '@nestjs/common';
import { JwtService } from '@nestjs/jwt';
import { AuthGuard } from '@nestjs/passport';
import { RateLimit } from 'nest-redis-rate-limit';

/** A login route: the per-IP policy must count the attempts that passport-local refuses. */
@Controller('auth')
export class LoginController {
  constructor(private readonly jwt: JwtService) {}

  @Post('login')
  @HttpCode(200)
  @UseGuards(AuthGuard('local'))
  @RateLimit(3, 0.001, 'ip')
  login(@Req() request: { user: { id: string } }) {
    return { token: this.jwt.sign({ sub: request.user.id }) };
  }
}

/** Signed-in routes: the auth guard sits on the controller, as most apps put it. */
@Controller('me')
@UseGuards(AuthGuard('jwt'))
export class ProfileController {
  @Get()
  @RateLimit(5, 0.001, 'user')
  profile(@Req() request: { user: { id: string } }) {
    return { id: request.user.id };
  }

  /** A per-IP burst and a per-user quota on one route, decided in two phases. */
  @Get('both')
  @RateLimit({ capacity: 3, refillPerSecond: 0.001, keyBy: 'ip', name: 'me-ip' })
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, keyBy: 'user', name: 'me-user' })
  both() {
    return { ok: true };
  }
}

/** A user-keyed policy on a route nobody authenticates. */
@Controller('open')
export class OpenController {
  @Get('user')
  @RateLimit(2, 0.001, 'user')
  user() {
    return { ok: true };
  }
}
