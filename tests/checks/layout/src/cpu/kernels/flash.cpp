// planted kernel flash
