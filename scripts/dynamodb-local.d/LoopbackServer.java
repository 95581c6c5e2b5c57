// DynamoDB Local bound to 127.0.0.1 only. Its own launcher (DynamoDBLocal.jar's main) has
// no host option and listens on every interface; this one builds the same server from the
// same command line, sets its Jetty connector's host to the loopback address before it
// starts, and leaves telemetry unconfigured (it is never sent).
//
// Compiled by scripts/dynamodb-local into .dynamodb-local/classes; run with the jar and
// DynamoDBLocal_lib/* on the class path.

import java.lang.reflect.Field;

import org.eclipse.jetty.server.AbstractNetworkConnector;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class LoopbackServer {
    private LoopbackServer() {}

    public static void main(String[] args) throws Exception {
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server server = (Server) field.get(proxy);
        int bound = 0;
        for (Connector connector : server.getConnectors()) {
            if (connector instanceof AbstractNetworkConnector network) {
                network.setHost("127.0.0.1");
                bound++;
            }
        }
        if (bound == 0) {
            throw new IllegalStateException("DynamoDB Local has no network connector to bind to 127.0.0.1");
        }
        proxy.start();
        System.out.println("DynamoDB Local listening on 127.0.0.1 only");
        proxy.join();
    }
}
