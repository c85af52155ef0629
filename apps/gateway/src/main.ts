import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { WsAdapter } from '@nestjs/platform-ws';
import { AppModule } from './app.module.js';
import { startMetrics } from './metrics.js';

async function bootstrap(): Promise<void> {
  // Before the app is created: the limiter finds the global MeterProvider when the app starts.
  startMetrics();
  const app = await NestFactory.create(AppModule);
  app.enableShutdownHooks();
  // Plain WebSockets for EchoGateway at /ws: any WebSocket client can try it.
  app.useWebSocketAdapter(new WsAdapter(app));
  const port = Number(process.env.PORT ?? 3000);
  await app.listen(port);
  new Logger('Gateway').log(`Listening on http://127.0.0.1:${port} (try GET /api/hello, then GET /metrics)`);
}

void bootstrap();
