import type { INestApplication, Type } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';

/** Nest's two HTTP platforms: every HTTP scenario runs on both. */
export const PLATFORMS = ['express', 'fastify'] as const;
export type Platform = (typeof PLATFORMS)[number];

/** How the HTTP platform itself is set up, the same way on both. */
export interface PlatformOptions {
  /** Trust X-Forwarded-For: Express `app.set('trust proxy', ...)`, Fastify `new FastifyAdapter({ trustProxy })`. Default off. */
  trustProxy?: boolean;
}

/** Compiles `module` and starts it on `platform`, ready for supertest on `app.getHttpServer()`. */
export async function createApp(
  module: Type | ReturnType<typeof Object>,
  platform: Platform,
  configure?: (app: INestApplication) => void,
  platformOptions: PlatformOptions = {},
): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({ imports: [module] }).compile();
  const { trustProxy } = platformOptions;
  const app =
    platform === 'fastify'
      ? moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(trustProxy === undefined ? undefined : { trustProxy }), {
          logger: false,
        })
      : moduleRef.createNestApplication<NestExpressApplication>({ logger: false });
  if (platform === 'express' && trustProxy !== undefined) {
    (app as NestExpressApplication).set('trust proxy', trustProxy);
  }
  configure?.(app);
  await app.init();
  if (platform === 'fastify') await (app as NestFastifyApplication).getHttpAdapter().getInstance().ready();
  return app;
}
