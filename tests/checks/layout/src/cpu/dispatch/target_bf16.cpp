// planted: none here
