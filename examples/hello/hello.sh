#!/bin/sh
echo "hello $(cat /srv/hello/greeting.txt), $(cat /srv/hello/built.txt)"
