// Launches a strata template through the stock E2B JS SDK's Sandbox API and checks what it
// can do: commands (foreground, failing, background + kill, stdin), files, info, list, a port
// served at getHost(port), pause, connect (resume), kill.
// Usage: node sandbox.mjs TEMPLATE (E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set).
// Prints one JSON line of results; exits non-zero on the first failed check.
import { Sandbox, CommandExitError } from 'e2b'
import http from 'node:http'

const [template] = process.argv.slice(2)
const check = (ok, what) => {
  if (!ok) {
    console.error(`check failed: ${what}`)
    process.exit(1)
  }
}

const sbx = await Sandbox.create(template, { timeoutMs: 120_000, envs: { FROM_JS: 'yes' }, metadata: { sdk: 'js' } })
const results = { sandboxId: sbx.sandboxId }
try {
  const r = await sbx.commands.run('echo $FROM_JS; whoami; echo err >&2')
  check(r.stdout === 'yes\nuser\n', `stdout ${JSON.stringify(r.stdout)}`)
  check(r.stderr === 'err\n', `stderr ${JSON.stringify(r.stderr)}`)

  let failed = null
  try {
    await sbx.commands.run('exit 7')
  } catch (e) {
    failed = e
  }
  check(failed instanceof CommandExitError && failed.exitCode === 7, `exit 7: ${failed}`)

  const bg = await sbx.commands.run('sleep 60', { background: true })
  const listed = (await sbx.commands.list()).map((p) => p.pid)
  check(listed.includes(bg.pid), `background pid ${bg.pid} in ${listed}`)
  check(await bg.kill(), 'kill answers true')
  let killed = null
  try {
    await bg.wait()
  } catch (e) {
    killed = e
  }
  check(killed instanceof CommandExitError && killed.exitCode === -1, `killed: ${killed}`)

  const cat = await sbx.commands.run('head -n 1', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'from js stdin\n')
  const echoed = await cat.wait()
  check(echoed.stdout === 'from js stdin\n', `stdin ${JSON.stringify(echoed.stdout)}`)

  await sbx.files.write('/home/user/js/note.txt', 'written by js')
  check((await sbx.files.read('/home/user/js/note.txt')) === 'written by js', 'file read back')
  const names = (await sbx.files.list('/home/user/js')).map((e) => e.name)
  check(names.length === 1 && names[0] === 'note.txt', `listing ${names}`)
  check(!(await sbx.files.exists('/home/user/js/missing')), 'missing file')

  const info = await sbx.getInfo()
  check(info.sandboxId === sbx.sandboxId && info.metadata.sdk === 'js', `info ${JSON.stringify(info)}`)
  const paginator = Sandbox.list({ query: { metadata: { sdk: 'js' } } })
  const page = await paginator.nextItems()
  check(page.some((s) => s.sandboxId === sbx.sandboxId), 'listed by metadata')
  check(await sbx.isRunning(), 'running')

  // A port of the sandbox, at the host name getHost gives, sent to the API's address as a
  // browser behind a resolver for the domain would (node's fetch may not set Host; http may).
  await sbx.commands.run('mkdir -p /tmp/www && echo served-to-js > /tmp/www/index.html')
  await sbx.commands.run('python3 -m http.server 8080 --directory /tmp/www', { background: true })
  const host = sbx.getHost(8080)
  check(host === `8080-${sbx.sandboxId}.${new URL(process.env.E2B_API_URL).hostname}`, `getHost ${host}`)
  const api = new URL(process.env.E2B_API_URL)
  const get = () =>
    new Promise((resolve, reject) => {
      const req = http.get({ host: api.hostname, port: api.port, path: '/', headers: { host } }, (res) => {
        let body = ''
        res.on('data', (c) => (body += c))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      })
      req.on('error', reject)
    })
  let served = null
  for (let i = 0; i < 100 && !(served && served.status === 200); i++) {
    if (served) await new Promise((r) => setTimeout(r, 200))
    served = await get()
  }
  check(served.status === 200 && served.body === 'served-to-js\n', `port 8080: ${JSON.stringify(served)}`)
  results.served = served.body.trim()

  // Pause keeps the filesystem; connect resumes it (on whichever node places it).
  await sbx.files.write('/home/user/js/paused.txt', 'kept through the pause')
  check((await sbx.pause()) === true, 'pause answers true')
  check((await sbx.pause()) === false, 'a second pause answers false (already paused)')
  check(!(await sbx.isRunning()), 'a paused sandbox does not answer')
  const back = await Sandbox.connect(sbx.sandboxId)
  check((await back.files.read('/home/user/js/paused.txt')) === 'kept through the pause', 'file kept through the pause')
  results.resumed = (await back.commands.run('echo resumed')).stdout === 'resumed\n'
} finally {
  results.killed = await sbx.kill()
}
check(results.killed === true, 'kill')
check(!(await sbx.isRunning()), 'not running after kill')
console.log(JSON.stringify(results))
