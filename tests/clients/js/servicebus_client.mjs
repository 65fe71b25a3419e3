// A client application written with the official JavaScript SDK (@azure/service-bus),
// driven by tests/clients/test_js_sdk.py against the local Service Bus emulator.
//
//   node servicebus_client.mjs <command> '<json arguments>'
//
// Each command prints one JSON document on stdout; the Python test checks it.
// Errors print {"error": ...} and exit 1, so the test shows what the SDK said.
import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";

const [command, rawArgs] = process.argv.slice(2);
const args = JSON.parse(rawArgs ?? "{}");
// Fail fast: the SDK's default retries would turn one emulator error into minutes.
const options = { retryOptions: { maxRetries: 1, timeoutInMs: 20000 } };

function describe(message) {
  return {
    messageId: message.messageId,
    correlationId: message.correlationId,
    contentType: message.contentType,
    subject: message.subject,
    sessionId: message.sessionId,
    body: message.body,
    bodyIsBuffer: Buffer.isBuffer(message.body),
    applicationProperties: message.applicationProperties ?? {},
    deliveryCount: message.deliveryCount,
    sequenceNumber: message.sequenceNumber?.toString(),
    state: message.state,
    scheduledEnqueueTimeUtc: message.scheduledEnqueueTimeUtc?.toISOString(),
    enqueuedTimeUtc: message.enqueuedTimeUtc?.toISOString(),
    deadLetterReason: message.deadLetterReason,
    deadLetterErrorDescription: message.deadLetterErrorDescription,
  };
}

async function receiveAll(receiver, count, waitMs) {
  const got = [];
  const deadline = Date.now() + waitMs;
  while (got.length < count && Date.now() < deadline) {
    const batch = await receiver.receiveMessages(count - got.length, {
      maxWaitTimeInMs: Math.max(500, Math.min(5000, deadline - Date.now())),
    });
    for (const message of batch) {
      await receiver.completeMessage(message);
      got.push(describe(message));
    }
  }
  return got;
}

const commands = {
  // Orders as the client guide says: the order object as the body (the SDK encodes it
  // as JSON once), MessageId = OrderID, ContentType application/json.
  async post(client) {
    const sender = client.createSender(args.queue);
    const messages = args.orders.map((order) => ({
      body: args.encoding === "string" ? JSON.stringify(order) : order,
      messageId: order.OrderID ?? "no-order-id",
      contentType: "application/json",
      applicationProperties: args.traceparent ? { traceparent: args.traceparent } : {},
    }));
    await sender.sendMessages(messages);
    await sender.close();
    return { sent: messages.map((m) => m.messageId) };
  },

  async receive(client) {
    const receiver = client.createReceiver(args.queue);
    const messages = await receiveAll(receiver, args.count, args.waitMs ?? 30000);
    await receiver.close();
    return { messages };
  },

  // The streaming receiver (subscribe), as most applications read their reply queue.
  async subscribe(client) {
    const receiver = client.createReceiver(args.queue);
    const messages = [];
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => resolve(), args.waitMs ?? 30000);
      receiver.subscribe({
        async processMessage(message) {
          messages.push(describe(message)); // completed by the SDK after this returns
          if (messages.length >= args.count) {
            clearTimeout(timer);
            resolve();
          }
        },
        async processError(args) {
          clearTimeout(timer);
          reject(args.error);
        },
      });
    });
    await receiver.close();
    return { messages };
  },

  async deadletters(client) {
    const receiver = client.createReceiver(args.queue, { subQueueType: "deadLetter" });
    const peeked = await receiver.peekMessages(args.max ?? 50, {});
    await receiver.close();
    return { messages: peeked.map(describe) };
  },

  async sessions(client) {
    const sender = client.createSender(args.queue);
    const sent = [];
    for (const [sessionId, count] of [["session-a", 3], ["session-b", 2]]) {
      for (let i = 0; i < count; i++) {
        const body = { sessionId, index: i };
        sent.push(body);
        await sender.sendMessages({ body, sessionId, messageId: `${sessionId}/${i}` });
      }
    }
    await sender.close();
    const a = await client.acceptSession(args.queue, "session-a");
    const fromA = await receiveAll(a, 3, 15000);
    await a.setSessionState(Buffer.from(JSON.stringify({ seen: fromA.length })));
    const state = await a.getSessionState(); // the SDK JSON-decodes a state that is JSON text
    const lockedUntil = a.sessionLockedUntilUtc?.toISOString();
    await a.renewSessionLock();
    await a.close();
    const next = await client.acceptNextSession(args.queue, { maxAutoLockRenewalDurationInMs: 0 });
    const nextId = next.sessionId;
    const fromNext = await receiveAll(next, 2, 15000);
    await next.close();
    return { fromA, state, lockedUntil, nextId, fromNext };
  },

  async schedule(client) {
    const sender = client.createSender(args.queue);
    const at = new Date(Date.now() + (args.delayMs ?? 3000));
    const [kept, cancelled] = await sender.scheduleMessages(
      [
        { body: { n: "kept" }, messageId: "scheduled-kept" },
        { body: { n: "cancelled" }, messageId: "scheduled-cancelled" },
      ],
      at,
    );
    await sender.cancelScheduledMessages([cancelled]);
    const receiver = client.createReceiver(args.queue);
    const peeked = (await receiver.peekMessages(10, {})).map(describe);
    const early = await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 });
    const later = await receiveAll(receiver, 1, 20000);
    await receiver.close();
    await sender.close();
    return {
      scheduledFor: at.toISOString(),
      sequenceNumbers: [kept.toString(), cancelled.toString()],
      peeked,
      receivedEarly: early.length,
      received: later,
      receivedAt: new Date().toISOString(),
    };
  },

  // Settle as a receiving application can: dead-letter with a reason, defer and fetch again.
  async settle(client) {
    const sender = client.createSender(args.queue);
    await sender.sendMessages([
      { body: { n: 1 }, messageId: "to-dead-letter" },
      { body: { n: 2 }, messageId: "to-defer" },
    ]);
    await sender.close();
    const receiver = client.createReceiver(args.queue);
    const messages = [];
    const deadline = Date.now() + 15000;
    while (messages.length < 2 && Date.now() < deadline) {
      messages.push(...(await receiver.receiveMessages(2 - messages.length, { maxWaitTimeInMs: 3000 })));
    }
    let deferred;
    for (const message of messages) {
      if (message.messageId === "to-dead-letter") {
        await receiver.deadLetterMessage(message, {
          deadLetterReason: "ClientRefused",
          deadLetterErrorDescription: "refused by the JavaScript client",
        });
      } else {
        deferred = message.sequenceNumber;
        await receiver.deferMessage(message);
      }
    }
    const [again] = await receiver.receiveDeferredMessages([deferred]);
    await receiver.completeMessage(again);
    await receiver.close();
    const dlq = client.createReceiver(args.queue, { subQueueType: "deadLetter" });
    const dead = (await dlq.peekMessages(10, {})).map(describe);
    await dlq.close();
    return { deferredAgain: describe(again), deadLetters: dead };
  },

  async admin() {
    const admin = new ServiceBusAdministrationClient(args.connection);
    try {
      await admin.getQueue(args.queue);
      return { served: true };
    } catch (error) {
      return { served: false, name: error.name, code: error.code, message: String(error.message) };
    }
  },
};

const run = commands[command];
if (!run) {
  console.log(JSON.stringify({ error: `unknown command ${command}` }));
  process.exit(2);
}
const client = new ServiceBusClient(args.connection, options);
try {
  console.log(JSON.stringify(await run(client)));
} catch (error) {
  console.log(JSON.stringify({ error: `${error.name}: ${error.message}`, code: error.code }));
  process.exitCode = 1;
} finally {
  await client.close();
}
