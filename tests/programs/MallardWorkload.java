// Multi-threaded Java workload for the LD_PRELOAD tests: heap maps per thread, native zlib and direct buffers.
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.zip.Deflater;
import java.util.zip.Inflater;

public class MallardWorkload {
    static final int THREADS = 4;
    static final int ENTRIES = 100000;

    /** Sum of the lengths of "v" + j*k over j: the test recomputes it. */
    static long mapWork(int k) {
        Map<Integer, String> m = new HashMap<>();
        for (int j = 0; j < ENTRIES; j++) {
            m.put(j, "v" + ((long) j * k));
        }
        long s = 0;
        for (String v : m.values()) {
            s += v.length();
        }
        return s;
    }

    /** Deflate then inflate a deterministic buffer with native zlib (its state lives in malloc'd memory). */
    static int zipRoundTrip(int k) throws Exception {
        byte[] data = new byte[200000 + k];
        for (int i = 0; i < data.length; i++) {
            data[i] = (byte) ((i * 31 + k) % 251 % 17);
        }
        Deflater d = new Deflater(6);
        d.setInput(data);
        d.finish();
        byte[] buf = new byte[data.length + 1024];
        int clen = d.deflate(buf);
        d.end();
        Inflater inf = new Inflater();
        inf.setInput(buf, 0, clen);
        byte[] back = new byte[data.length];
        int n = inf.inflate(back);
        inf.end();
        if (n != data.length || !java.util.Arrays.equals(data, back)) {
            throw new IllegalStateException("zlib round trip lost data");
        }
        return n;
    }

    /** Off-heap buffers (malloc'd by the JVM), written and summed. */
    static long directWork(int k) {
        long s = 0;
        for (int r = 0; r < 50; r++) {
            ByteBuffer b = ByteBuffer.allocateDirect(4096 * (1 + (r + k) % 16));
            for (int i = 0; i < b.capacity(); i += 512) {
                b.put(i, (byte) 1);
            }
            for (int i = 0; i < b.capacity(); i += 512) {
                s += b.get(i);
            }
        }
        return s;
    }

    public static void main(String[] args) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(THREADS);
        @SuppressWarnings("unchecked")
        Future<long[]>[] fs = new Future[THREADS];
        for (int t = 0; t < THREADS; t++) {
            final int k = t + 1;
            fs[t] = pool.submit(() -> new long[] {mapWork(k), zipRoundTrip(k), directWork(k)});
        }
        long maps = 0, zipped = 0, direct = 0;
        for (Future<long[]> f : fs) {
            long[] r = f.get();
            maps += r[0];
            zipped += r[1];
            direct += r[2];
        }
        pool.shutdown();
        System.out.println("maps=" + maps + " zipped=" + zipped + " direct=" + direct);
    }
}
